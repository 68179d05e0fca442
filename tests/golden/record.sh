#!/usr/bin/env bash
# Records the golden scenarios' results (tests/golden/scenarios.h) into tests/data/golden.pt, from
# the code as it is now: run it on the commit *before* a change that must leave results unchanged,
# then make the change; Golden.* compares the changed code with the recording (bit for bit on the
# machine that recorded it, to float32 rounding of the BLAS's summation order elsewhere).
#   tests/golden/record.sh [BUILD_DIR]
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
build="${1:-build}"
cmake --build "$build" --target muon_golden_record -j"$(nproc)"
"$build/tests/muon_golden_record" tests/data/golden.pt
