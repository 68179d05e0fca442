#!/usr/bin/env bash
# The C++ test suite under AddressSanitizer + UndefinedBehaviorSanitizer: builds everything with
# clang into build-asan/ (override with MUON_ASAN_DIR), with the libFuzzer targets, and runs every
# CTest entry there. `--build-only` stops after the build (scripts/fuzz.sh uses it). This build
# runs the Newton–Schulz products on the CBLAS backend (MUON_USE_BLIS=OFF), build/ on BLIS, so
# CI tests both.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
bash scripts/setup.sh --packages-only clang libclang-rt-14-dev

build_dir="${MUON_ASAN_DIR:-build-asan}"
CC=clang CXX=clang++ cmake -S . -B "$build_dir" -G Ninja -DCMAKE_BUILD_TYPE=Release \
  -DMUON_SANITIZE=ON -DMUON_USE_BLIS=OFF -DMUON_BUILD_PYTHON=OFF -DMUON_BUILD_BENCHMARKS=OFF >/dev/null
cmake --build "$build_dir" -j"$(nproc)"
[ "${1:-}" = "--build-only" ] && exit 0

# LibTorch itself is not instrumented: its one-time static allocations are not ours to report.
# A failed allocation throws std::bad_alloc, as without ASan (LibTorch believes sizes written in
# a corrupt checkpoint; the loader reports such a file as corrupt).
export ASAN_OPTIONS="detect_leaks=0:abort_on_error=1:allocator_may_return_null=1:strict_string_checks=1:detect_stack_use_after_return=1"
export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1"
status=0
ctest --test-dir "$build_dir" -j"$(nproc)" --output-on-failure --timeout 1500 \
  --output-junit junit.xml --test-output-size-passed 1000000 || status=$?
python3 scripts/skips.py "$build_dir/junit.xml" --stage "ASan + UBSan ($build_dir)" || status=1
exit "$status"
