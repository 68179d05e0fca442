#!/usr/bin/env bash
# A rank that dies (SIGKILL) or hangs (SIGSTOP) mid-run: the surviving rank must exit non-zero
# with a clear message within the --dist-timeout (5 s here), and its last checkpoint must be whole.
# Usage: distributed_faults.sh MUON_BINARY DATA_FILE WORK_DIR
set -uo pipefail
muon=$1 data=$2 work=$3
rm -rf "$work" && mkdir -p "$work"
timeout_s=5

free_port() { /usr/bin/python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }

start_rank() {  # rank port dir; one thread each, as torchrun (and --nproc) share the cores
  OMP_NUM_THREADS=1 RANK=$1 WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=$2 "$muon" train --data "$data" \
    --steps 100000 --layers 1 --d-model 32 --seq-len 32 --batch-size 4 --log-every 5 \
    --eval-every 1000000 --checkpoint-every 10 --dist-timeout $timeout_s --out "$3" \
    >"$3.rank$1.log" 2>&1 &
  started=$!
}

# Waits until rank 0 has logged step 20, i.e. both ranks are well into training.
wait_for_progress() {
  for _ in $(seq 600); do
    grep -q "step    20/" "$1" 2>/dev/null && return 0
    sleep 0.1
  done
  echo "FAIL: no progress in $1"; cat "$1"; return 1
}

check_case() {  # name signal
  local name=$1 signal=$2 dir="$work/$1" port rank0 rank1 start elapsed code
  port=$(free_port)
  start_rank 0 "$port" "$dir"; rank0=$started
  start_rank 1 "$port" "$dir"; rank1=$started
  wait_for_progress "$dir.rank0.log" || { kill -9 "$rank0" "$rank1"; return 1; }
  start=$(date +%s.%N)
  kill "-$signal" "$rank1"
  wait "$rank0"; code=$?
  elapsed=$(echo "$(date +%s.%N) - $start" | bc)
  kill -9 "$rank1" 2>/dev/null; wait "$rank1" 2>/dev/null
  echo "$name: rank 0 exited with $code after ${elapsed}s: $(grep error "$dir.rank0.log")"
  [ "$code" -eq 3 ] || { echo "FAIL: $name: exit code $code, expected 3"; cat "$dir.rank0.log"; return 1; }
  grep -q "error (rank 0 of 2): distributed: .* failed on rank 0 of 2: .*another rank exited, hung" \
    "$dir.rank0.log" || { echo "FAIL: $name: unclear message"; cat "$dir.rank0.log"; return 1; }
  (( $(echo "$elapsed < $timeout_s + 10" | bc) )) || { echo "FAIL: $name: took ${elapsed}s"; return 1; }
  # The last checkpoint is whole: PyTorch reads it, and it is at a multiple of 10 steps.
  PYTHONPATH="$(dirname "${BASH_SOURCE[0]}")/python" /usr/bin/python3 -c "
import sys, torch
from torch_checkpoint import load_checkpoint
c = load_checkpoint('$dir/checkpoint.pt')
assert c['format'] == 'muon-cpp checkpoint' and c['step_count'] % 10 == 0 and c['step_count'] >= 10, c['step_count']
print('$name: checkpoint at step', c['step_count'], 'is whole')" || return 1
  if ls "$dir"/checkpoint.pt.tmp.* >/dev/null 2>&1; then echo "FAIL: $name: partial file left"; return 1; fi
}

check_case killed KILL && check_case hung STOP
