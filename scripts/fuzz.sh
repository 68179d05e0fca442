#!/usr/bin/env bash
# Runs the libFuzzer targets (fuzz/) for SECONDS each (default 600), one after another, on the
# sanitizer build. Corpora grow in build-asan/fuzz/<target>/corpus (seeded from fuzz/corpus/);
# a finding is written to build-asan/fuzz/<target>/ and the script fails — copy it into
# tests/data/fuzz/<target>/, where tests/test_fuzz_regressions.cpp keeps checking it.
#   scripts/fuzz.sh [SECONDS] [config|checkpoint ...]
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
seconds="${1:-600}"
shift || true
targets=("$@")
[ ${#targets[@]} -eq 0 ] && targets=(config checkpoint)
bash scripts/sanitizers.sh --build-only
build_dir="${MUON_ASAN_DIR:-build-asan}"
export ASAN_OPTIONS="detect_leaks=0:abort_on_error=1:allocator_may_return_null=1"
export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1"

for target in "${targets[@]}"; do
  work="$build_dir/fuzz/$target"
  mkdir -p "$work/corpus"
  cp -n fuzz/corpus/"$target"/* "$work/corpus/" 2>/dev/null || true
  if [ "$target" = checkpoint ]; then  # a valid checkpoint of the fuzzer's own fixture
    MUON_FUZZ_WRITE_SEED="$work/corpus/seed.pt" "$build_dir/fuzz/fuzz_checkpoint"
  fi
  echo "fuzz: $target for ${seconds}s"
  "$build_dir/fuzz/fuzz_$target" "$work/corpus" -max_total_time="$seconds" -max_len=65536 \
    -timeout=30 -rss_limit_mb=4096 -malloc_limit_mb=1048576 -print_final_stats=1 -artifact_prefix="$work/" 2>&1 |
    tee "$work/log.txt" | grep -E "^#[0-9]+ +(INITED|DONE)|stat::|ERROR|finding|Test unit" || true
  findings=$(find "$work" -maxdepth 1 \( -name 'crash-*' -o -name 'leak-*' -o -name 'timeout-*' \
    -o -name 'oom-*' \) | sort)
  if [ -n "$findings" ]; then
    echo "fuzz: $target found inputs that fail:"
    echo "$findings"
    exit 1
  fi
done
