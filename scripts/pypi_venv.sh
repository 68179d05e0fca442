#!/usr/bin/env bash
# A virtual environment of this machine's Python holding PyPI's current torch — the PyTorch almost
# every Python user has (a CUDA build; it runs on the CPU too) — and what the Python tests use.
#
#   scripts/pypi_venv.sh DIR          # make DIR if it lacks torch; print its interpreter's path
#   scripts/pypi_venv.sh --fresh DIR  # make DIR anew
#
# The interpreter is $MUON_PYPI_PYTHON (default: the python3 first on PATH). PyPI's torch is
# several GB; pip's own cache keeps repeated installs on one machine quick.
set -euo pipefail
fresh=""
if [ "${1:-}" = "--fresh" ]; then fresh=1; shift; fi
venv="${1:?usage: scripts/pypi_venv.sh [--fresh] DIR}"
python="${MUON_PYPI_PYTHON:-python3}"
[ -n "$fresh" ] && rm -rf "$venv"
if ! "$venv/bin/python" -c "import torch, pybind11, pytest, transformers, lightning, accelerate, jsonargparse" \
    2>/dev/null; then
  rm -rf "$venv"
  "$python" -m venv "$venv" >&2
  # torch from PyPI; pybind11 for the extension (the version torch's own headers expect);
  # pytest, hypothesis, PyYAML and numpy for the tests; transformers, lightning and accelerate,
  # the stacks python/tests/test_stacks.py trains in (jsonargparse: Lightning's CLI).
  "$venv/bin/pip" install -q --upgrade pip >&2
  "$venv/bin/pip" install -q torch pybind11 pytest hypothesis pyyaml numpy \
    transformers lightning accelerate "jsonargparse[signatures]" >&2
fi
echo "$(cd "$venv" && pwd)/bin/python"
