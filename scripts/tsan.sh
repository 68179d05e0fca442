#!/usr/bin/env bash
# The C++ tests that run threads, under ThreadSanitizer (docs/robustness.md, "Race detector"):
# builds the library, the GoogleTest binary and a deliberately racy program with clang and
# -fsanitize=thread into build-tsan/ (override with MUON_TSAN_DIR), OpenMP on LLVM's libomp with
# its Archer tool, then
#   1. runs tests/tsan_race.cpp, whose at::parallel_for threads increment one non-atomic counter:
#      the stage fails unless ThreadSanitizer reports that data race (so that a clean run below
#      means the sanitizer saw the threads), and unless it ran on 2 OpenMP threads;
#   2. runs the GoogleTest suite at OMP_NUM_THREADS=2 (CTest's entries set 1) — among it the
#      orthogonalization's fp32 and bf16 dealt blocks at 2 and 4 threads, Muon's lanes, the fused
#      update kernels and stochastic rounding, the distributed tests (ranks on std::thread and
#      Gloo) — failing on any report or failure.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
bash scripts/setup.sh --packages-only clang libclang-rt-14-dev libomp-14-dev

build_dir="${MUON_TSAN_DIR:-build-tsan}"
CC=clang CXX=clang++ cmake -S . -B "$build_dir" -G Ninja -DCMAKE_BUILD_TYPE=Release \
  -DMUON_TSAN=ON -DMUON_USE_BLIS=ON -DMUON_BUILD_PYTHON=OFF -DMUON_BUILD_BENCHMARKS=OFF \
  -DMUON_BUILD_CLI=OFF >/dev/null
cmake --build "$build_dir" -j"$(nproc)" --target muon_tsan_race muon_tests

# Archer (LLVM's OMPT tool) tells ThreadSanitizer what libomp's barriers and forks order; LibTorch
# and libomp are not instrumented, and races inside them are not ours to report.
libdir="$(dirname "$(readlink -f "$(command -v clang)")")/../lib"
export OMP_TOOL_LIBRARIES="$libdir/libarcher.so"
export TSAN_OPTIONS="ignore_noninstrumented_modules=1 halt_on_error=1 second_deadlock_stack=1"
[ -f "$OMP_TOOL_LIBRARIES" ] || { echo "tsan: no $OMP_TOOL_LIBRARIES (libomp-14-dev)" >&2; exit 1; }

race_log="$build_dir/tsan_race.log"
if "$build_dir/tests/muon_tsan_race" >"$race_log" 2>&1; then
  cat "$race_log"; echo "tsan: the deliberate race was not reported: the stage sees nothing" >&2
  exit 1
fi
if ! grep -q "WARNING: ThreadSanitizer: data race" "$race_log" ||
   ! grep -q "SUMMARY: ThreadSanitizer: data race .*tsan_race.cpp" "$race_log"; then
  cat "$race_log"; echo "tsan: the racy program failed without the report expected" >&2; exit 1
fi
# Once more without halting, for the thread count and the runtime serving LibTorch.
TSAN_OPTIONS="$TSAN_OPTIONS halt_on_error=0 report_bugs=0" "$build_dir/tests/muon_tsan_race" |
  tee -a "$race_log" | grep "ran on 2 OpenMP threads.*GOMP_parallel from .*libomp" >/dev/null || {
  cat "$race_log"; echo "tsan: the racy program did not run on 2 libomp threads" >&2; exit 1; }
echo "tsan: the deliberate race is caught: $(grep -m1 '^SUMMARY' "$race_log")"
grep "^tsan_race:" "$race_log"

# Every test but two whole training runs (bf16-state AdamW, every example recipe): 4 of the 6
# minutes the suite takes under TSan on 2 cores, and their parallel regions are the kernels the
# other tests run at 2 and 4 threads.
filter="-Train.Bf16StateAdamWTrainsLikeFp32State:Train.EachSeedRecipeInExamplesTrains"
status=0
rm -f "$build_dir/tsan.xml"
OMP_NUM_THREADS=2 "$build_dir/tests/muon_tests" --gtest_filter="$filter" \
  --gtest_output="xml:$build_dir/tsan.xml" 2>&1 | tee "$build_dir/tsan.log" || status=$?
if grep -q "WARNING: ThreadSanitizer" "$build_dir/tsan.log"; then
  echo "tsan: ThreadSanitizer reported (above, and in $build_dir/tsan.log)" >&2; status=1
fi
# GoogleTest's XML puts "file:line" before a skip's reason; skips.py reads the reason alone.
if [ -f "$build_dir/tsan.xml" ]; then
  sed -i 's/<skipped message="[^"&]*&#x0A;/<skipped message="/' "$build_dir/tsan.xml"
  python3 scripts/skips.py "$build_dir/tsan.xml" --stage "ThreadSanitizer ($build_dir)" || status=1
else
  status=1  # the binary stopped before writing it
fi
exit "$status"
