#!/usr/bin/env bash
# Data parallelism across hosts, on one machine: two network namespaces joined by a veth pair act
# as hosts A (10.211.0.1) and B (10.211.0.2), each with its own network stack, loopback and
# interface `muon0`. Two ranks of `muon train` run on each; rank 0 serves the TCPStore on A, and
# Gloo talks over muon0 (GLOO_SOCKET_IFNAME). Checks, in order:
#   1. the four ranks across the two hosts train exactly as four ranks on one host do (`--nproc
#      4` on loopback): the final checkpoints' parameters and optimizer state equal bit for bit;
#   2. host B dropping off the network mid-run (its interface goes down: no FIN, no RST, as when
#      a machine loses power) makes the ranks on A exit with status 3 and the distributed error
#      within the timeout, their last checkpoint whole.
# Usage: scripts/two_hosts.sh MUON_BINARY DATA_FILE WORK_DIR
# Needs root (or CAP_NET_ADMIN and CAP_SYS_ADMIN) and iproute2: without them it prints why and
# exits 77, which CTest reports as skipped. The namespaces are removed on exit.
set -uo pipefail
[ $# -eq 3 ] || { echo "usage: $0 MUON_BINARY DATA_FILE WORK_DIR" >&2; exit 2; }
muon=$(realpath "$1") data=$(realpath "$2") work=$3
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
timeout_s=5

skip() { echo "two_hosts: needs software: $*"; exit 77; }
fail() { echo "two_hosts: FAIL: $*"; exit 1; }
command -v ip >/dev/null || skip "no 'ip' command here (package iproute2)"
command -v nsenter >/dev/null || skip "no 'nsenter' command here (package util-linux)"
# Runs a command on a host. nsenter switches only the network namespace: `ip netns exec` and
# `ip -n` also remount / and /sys, which fails inside a chroot.
on() { nsenter --net="/run/netns/$1" "${@:2}"; }

host_a=muonA$$ host_b=muonB$$
all_ranks=()
cleanup() {
  [ ${#all_ranks[@]} -gt 0 ] && kill -9 "${all_ranks[@]}" 2>/dev/null
  ip netns del "$host_a" 2>/dev/null
  ip netns del "$host_b" 2>/dev/null
}
trap cleanup EXIT
if ! err=$(ip netns add "$host_a" 2>&1); then
  skip "network namespaces are not permitted here (ip netns add: $err)"
fi
if ! err=$(on "$host_a" ip link set lo up 2>&1); then
  skip "network namespaces cannot be entered here (nsenter: $err)"
fi
ip netns add "$host_b" || fail "ip netns add $host_b"
if ! err=$(ip link add "va$$" type veth peer name "vb$$" 2>&1); then
  skip "veth pairs are not permitted here (ip link add: $err)"
fi
ip link set "va$$" netns "$host_a" && ip link set "vb$$" netns "$host_b" &&
  on "$host_a" ip link set "va$$" name muon0 && on "$host_b" ip link set "vb$$" name muon0 &&
  on "$host_a" ip addr add 10.211.0.1/24 dev muon0 &&
  on "$host_b" ip addr add 10.211.0.2/24 dev muon0 || fail "setting up the veth pair"
for host in "$host_a" "$host_b"; do
  on "$host" ip link set lo up && on "$host" ip link set muon0 up || fail "bringing up $host"
done
echo "two_hosts: hosts $host_a (10.211.0.1) and $host_b (10.211.0.2) joined by a veth pair"

rm -rf "$work" && mkdir -p "$work"
train_args=(train --data "$data" --layers 1 --d-model 32 --seq-len 32 --batch-size 4
            --eval-every 1000000 --log-every 10 --dist-timeout "$timeout_s")

start_rank() {  # host rank out steps: one thread each, as --nproc and torchrun share the cores
  on "$1" env OMP_NUM_THREADS=1 GLOO_SOCKET_IFNAME=muon0 RANK="$2" WORLD_SIZE=4 \
    MASTER_ADDR=10.211.0.1 MASTER_PORT=29500 \
    "$muon" "${train_args[@]}" --steps "$4" --checkpoint-every 10 --out "$3" \
    >"$3.rank$2.log" 2>&1 &
  started=$!
  all_ranks+=("$started")
}

# 1. Across the hosts, then on one host; the same checkpoint.
start_rank "$host_a" 0 "$work/across" 20; ranks=($started)
start_rank "$host_a" 1 "$work/across" 20; ranks+=($started)
start_rank "$host_b" 2 "$work/across" 20; ranks+=($started)
start_rank "$host_b" 3 "$work/across" 20; ranks+=($started)
for pid in "${ranks[@]}"; do
  wait "$pid" || { tail -n 5 "$work"/across.rank*.log; fail "a rank across the hosts failed"; }
done
grep "step    20/20" "$work/across.rank0.log" || fail "no step 20 in $work/across.rank0.log"
OMP_NUM_THREADS=1 "$muon" "${train_args[@]}" --steps 20 --checkpoint-every 10 --nproc 4 \
  --out "$work/one_host" >"$work/one_host.log" 2>&1 || { cat "$work/one_host.log"; fail "--nproc 4"; }
PYTHONPATH="$repo/tests/python" /usr/bin/python3 -c "
import sys, torch
from torch_checkpoint import load_checkpoint
def same(x, y, where):
    if isinstance(x, torch.Tensor):
        assert torch.equal(x, y), where
    elif isinstance(x, dict):
        assert x.keys() == y.keys(), where
        for key in x:
            same(x[key], y[key], f'{where}.{key}')
    else:
        assert x == y, (where, x, y)
a, b = (load_checkpoint(f'$work/{d}/checkpoint.pt') for d in ('across', 'one_host'))
assert a['step_count'] == b['step_count'] == 20, (a['step_count'], b['step_count'])
same(a['model'], b['model'], 'model')
same(a['state'], b['state'], 'state')
print('two_hosts: 4 ranks on 2 hosts = 4 ranks on one host, bit for bit:',
      len(a['model']), 'parameters and', len(a['state']), 'optimizer state entries after 20 steps')
" || fail "the run across the hosts differs from the run on one host"

# 2. Host B leaves the network mid-run.
start_rank "$host_a" 0 "$work/partition" 100000; rank0=$started
start_rank "$host_a" 1 "$work/partition" 100000; rank1=$started
start_rank "$host_b" 2 "$work/partition" 100000
start_rank "$host_b" 3 "$work/partition" 100000
for _ in $(seq 600); do
  grep -q "step    20/" "$work/partition.rank0.log" 2>/dev/null && break
  sleep 0.1
done
grep -q "step    20/" "$work/partition.rank0.log" || fail "no progress: $(tail -n 3 "$work/partition.rank0.log")"
start=$(date +%s%N)
on "$host_b" ip link set muon0 down
for rank in 0 1; do
  pid=$([ $rank -eq 0 ] && echo $rank0 || echo $rank1)
  wait "$pid"; code=$?
  elapsed_ms=$(( ($(date +%s%N) - start) / 1000000 ))
  message=$(grep "error (rank $rank of 4)" "$work/partition.rank$rank.log")
  echo "two_hosts: host B down; rank $rank exited with $code after ${elapsed_ms} ms: $message"
  [ "$code" -eq 3 ] || fail "rank $rank: exit status $code, expected 3"
  [[ $message == *"distributed: "*"failed on rank $rank of 4: "*"another rank exited, hung"* ]] ||
    fail "rank $rank: unclear message: $(tail -n 3 "$work/partition.rank$rank.log")"
  (( elapsed_ms < (timeout_s + 10) * 1000 )) || fail "rank $rank took ${elapsed_ms} ms"
done
PYTHONPATH="$repo/tests/python" /usr/bin/python3 -c "
from torch_checkpoint import load_checkpoint
c = load_checkpoint('$work/partition/checkpoint.pt')
assert c['step_count'] % 10 == 0 and c['step_count'] >= 10, c['step_count']
print('two_hosts: the last checkpoint, at step', c['step_count'], 'is whole')" ||
  fail "the last checkpoint is not whole"
ls "$work"/partition/checkpoint.pt.tmp.* >/dev/null 2>&1 && fail "a partial checkpoint was left"
echo "two_hosts: OK"
