#!/usr/bin/env bash
# The main job: set up, build, and train the demo GPT on the King James Bible with the embedded
# default config. Extra arguments go to `muon train` (e.g. --steps 100 --out runs/short).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
bash scripts/setup.sh
exec "${MUON_BUILD_DIR:-build}/muon" train "$@"
