#!/usr/bin/env bash
# The Python suite as a user of PyPI's torch meets it: a fresh virtual environment of this
# machine's Python with PyPI's current torch (scripts/pypi_venv.sh), `pip install .` into it,
# then every test of python/tests against the installed package, from outside the source tree.
#
#   scripts/pypi_test.sh [PYTEST ARGS...]
#
# Work goes to $MUON_PYPI_DIR (default build-pypi/ in the repository): venv/, the extension's
# CMake build (build/, kept for ccache-fast reruns) and the test run's directory.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
repo="$(pwd)"
# The build's packages: compiler, CMake, yaml-cpp, BLIS, oneDNN (scripts/setup.sh's list).
bash scripts/setup.sh --packages-only build-essential cmake ninja-build ccache libyaml-cpp-dev \
  libblis-openmp-dev libdnnl-dev libopenblas-dev bible-kjv
work="${MUON_PYPI_DIR:-$repo/build-pypi}"
mkdir -p "$work"
python="$(bash scripts/pypi_venv.sh --fresh "$work/venv")"
"$python" -c 'import sys, torch; print(f"pypi: Python {sys.version.split()[0]}, torch "
                                      f"{torch.__version__} (CUDA {torch.version.cuda})")'
MUON_BUILD_DIR="$work/build" "$python" -m pip install -q "$repo"
# From a directory outside the tree, so that `import muon_cpp` finds the installed package.
mkdir -p "$work/run"
cd "$work/run"
# A skipped test fails the run, as in CTest (python/CMakeLists.txt): every test applies here.
OMP_NUM_THREADS=1 "$python" -m pytest -q -p no:cacheprovider "$repo/python/tests" "$@" |
  tee "$work/pytest.log"
if grep -Eq '[0-9]+ skipped' "$work/pytest.log"; then
  echo "pypi: tests were skipped; every test must run against PyPI's torch" >&2
  exit 1
fi
