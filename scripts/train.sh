#!/usr/bin/env bash
# The main job: set up, build, and train the demo GPT on the King James Bible with the embedded
# default config. Extra arguments go to `muon train` (e.g. --steps 100 --out runs/short); without
# any, it trains into runs/latest, replacing the run a previous call left there.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
bash scripts/setup.sh muon_cli  # the library and the CLI only: no tests or benchmarks
if [ $# -eq 0 ]; then set -- --out runs/latest --overwrite; fi
exec "${MUON_BUILD_DIR:-build}/muon" train "$@"
