#!/usr/bin/env bash
# `muon train --resume` on another number of ranks keeps the run's global batch
# (docs/distributed.md): 2 ranks × 4 stopped at step 4 and finished on 1 rank (--batch-size 8),
# and 1 rank × 8 finished on 2 ranks (no --batch-size: the global batch is kept), log the same
# losses as 2 ranks that never stopped, to 1e-3; a world size that does not divide the batch and a
# batch size that changes it are refused with the numbers.
# Usage: resume_ranks.sh MUON_BINARY DATA_FILE WORK_DIR
set -uo pipefail
muon=$1 data=$2 work=$3
rm -rf "$work" && mkdir -p "$work"
# A constant rate: a run stopped by --steps 4 and resumed with --steps 8 takes the same updates
# as one of 8 steps.
printf 'optimizer: {name: muon, lr: 0.02, adamw_lr: 0.004, schedule: {name: constant}}\n' \
  >"$work/constant.yaml"
run() {  # out_dir args...: a fresh tiny run
  local out=$1; shift
  OMP_NUM_THREADS=1 "$muon" train --data "$data" --config "$work/constant.yaml" --layers 1 \
    --d-model 32 --seq-len 32 --log-every 2 --eval-every 4 --eval-batches 1 --out "$out" "$@" \
    >"$out.log" 2>&1 || { echo "FAIL: muon train $* (in $out)"; cat "$out.log"; exit 1; }
}
resume() {  # out_dir args...
  local out=$1; shift
  OMP_NUM_THREADS=1 "$muon" train --resume "$out" --steps 8 "$@" >>"$out.log" 2>&1 ||
    { echo "FAIL: muon train --resume $out $*"; cat "$out.log"; exit 1; }
}
losses() { cut -d, -f1-3 "$1/metrics.csv"; }  # step, train loss, val loss
same_losses() {  # dir: its losses equal the uninterrupted run's to 1e-3
  paste -d, <(losses "$work/whole") <(losses "$1") | awk -F, -v run="$1" '
    NR == 1 { next }
    { for (i = 1; i <= 3; i++) { d = $i - $(i + 3); if (d < 0) d = -d; if (d > 1e-3) bad = 1 } }
    END { if (NR != 6 || bad) { print "FAIL: " run " differs from the uninterrupted run"; exit 1 } }' ||
    { paste -d' ' <(losses "$work/whole") <(losses "$1"); exit 1; }
  echo "$(basename "$1"): the losses of the uninterrupted run (rows: $(($(wc -l <"$1/metrics.csv") - 1)))"
}
run "$work/whole" --nproc 2 --batch-size 4 --steps 8
run "$work/two_to_one" --nproc 2 --batch-size 4 --steps 4
resume "$work/two_to_one" --nproc 1 --batch-size 8
same_losses "$work/two_to_one"
run "$work/one_to_two" --nproc 1 --batch-size 8 --steps 4
resume "$work/one_to_two" --nproc 2
grep -q "1 thread.*, 2 ranks" "$work/one_to_two.log" || { echo "FAIL: no 2-rank header"; exit 1; }
same_losses "$work/one_to_two"

refused() {  # expected-message args...
  local expected=$1 out; shift
  out=$("$muon" train --resume "$work/whole" "$@" 2>&1); code=$?
  [ "$code" -eq 2 ] && grep -qF -- "$expected" <<<"$out" ||
    { echo "FAIL: $* (exit $code): $out"; exit 1; }
  echo "refused: $*"
}
refused "train: the run's global batch of 8 sequences (4 per rank × 2 ranks) does not divide among 3 ranks; run it on a number of ranks that divides it (--nproc 1, 2, 4, 8)" --nproc 3
refused "train: --batch-size 4 on 1 rank makes a global batch of 4, but the run in $work/whole trains 8 sequences a step (4 per rank × 2 ranks); on 1 rank, --batch-size 8 continues it (as does leaving it out)" --batch-size 4
echo "resume across ranks: OK"
