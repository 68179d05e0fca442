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
torch_version="$("$python" -c 'import torch; print(torch.__version__)')"
MUON_BUILD_DIR="$work/build" "$python" -m pip install -q "$repo"
# From a directory outside the tree, so that `import muon_cpp` finds the installed package.
mkdir -p "$work/run"
cd "$work/run"
# Everything a test can need from software is installed here: a test skipped for want of
# software fails the run (scripts/skips.py --hardware-only); one needing hardware (bf16 dot
# products) is counted and named.
status=0
OMP_NUM_THREADS=1 "$python" -m pytest -q -rs -p no:cacheprovider --junitxml="$work/pytest.xml" \
  "$repo/python/tests" "$@" || status=$?
python3 "$repo/scripts/skips.py" "$work/pytest.xml" --stage "pypi (torch $torch_version)" \
  --hardware-only || status=1
# Again as a CPU without bf16 dot products (bf16 emulated, torch's bf16 GEMM crawling): the
# thread-count bits and the bf16 steps beside torch.optim.Muon and PyTorch's frozen values.
ONEDNN_MAX_CPU_ISA=AVX2 OMP_NUM_THREADS=1 "$python" -m pytest -q -rs -p no:cacheprovider \
  "$repo/python/tests/test_threads.py" "$repo/python/tests/test_torch_optim_muon.py" \
  -k "threads or frozen or bf16" || status=$?
exit "$status"
