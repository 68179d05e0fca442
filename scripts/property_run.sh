#!/usr/bin/env bash
# The long run of the property tests (docs/robustness.md §Property tests): the Python entry points
# (python/tests/test_properties.py) and the command line (python/tests/cli_properties.py), each
# in rounds under the `long` profile with a fresh seed per round, side by side (one core each),
# until SECONDS have passed; then their tallies go into docs/property_run.json and the table of
# docs/robustness.md (scripts/robustness_tables.py). A failing example ends its file's rounds
# with Hypothesis's report of it, and the run with a non-zero status (nothing recorded).
#
#   scripts/property_run.sh [SECONDS=600]      # after scripts/setup.sh built build/
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
seconds="${1:-600}"
build="$(cd "${MUON_BUILD_DIR:-build}" && pwd)"
repo="$(pwd)"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
start=$(date +%s)

# rounds FILE: runs FILE with seeds 1, 2, ... until the time is up; prints the rounds it ran.
rounds() {
  local file="$1" seed=0
  while [ $(($(date +%s) - start)) -lt "$seconds" ]; do
    seed=$((seed + 1))
    (cd "$build/python" && MUON_PROPERTY_PROFILE=long MUON_PROPERTY_REPORT="$work/$file.json" \
      MUON_CLI="$build/muon" PYTHONPATH="$build/python" OMP_NUM_THREADS=1 \
      /usr/bin/python3 -m pytest -q -p no:cacheprovider --hypothesis-seed="$seed" \
      -k "not listed" "$repo/python/tests/$file") >"$work/$file.log" 2>&1 ||
      { cat "$work/$file.log"; echo "property_run: $file failed at seed $seed" >&2; return 1; }
  done
  echo "$seed" >"$work/$file.rounds"
}
rounds test_properties.py &
python_run=$!
rounds cli_properties.py &
cli_run=$!
status=0
wait "$python_run" || status=1
wait "$cli_run" || status=1
[ "$status" -eq 0 ] || exit 1
elapsed=$(($(date +%s) - start))
/usr/bin/python3 scripts/robustness_tables.py --record "$work" --seconds "$elapsed" \
  --command "scripts/property_run.sh $seconds"
