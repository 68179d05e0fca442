#!/usr/bin/env bash
# The whole test suite: set up, build, then every C++ test (GoogleTest, CLI checks and the
# installed-package consumer example) through CTest.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
bash scripts/setup.sh
ctest --test-dir "${MUON_BUILD_DIR:-build}" --output-on-failure -j"$(nproc)"
