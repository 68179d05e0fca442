#!/usr/bin/env bash
# The whole test suite: set up, build, then every test through CTest — GoogleTest, CLI checks,
# distributed runs, the pytest files of the Python module and the installed-package consumer.
# (scripts/sanitizers.sh runs the C++ tests again under ASan + UBSan.)
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
MUON_WERROR=ON bash scripts/setup.sh  # CI fails on a new compiler warning (GCC)
ctest --test-dir "${MUON_BUILD_DIR:-build}" --output-on-failure -j"$(nproc)"
