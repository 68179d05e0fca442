#!/usr/bin/env bash
# `pip install` of the source tree into a fresh virtual environment that sees the system's torch
# (--system-site-packages), then an import and one checked step from outside the tree. Offline
# (--no-index): the build backend needs nothing from PyPI.
#   pip_install.sh SOURCE_DIR WORK_DIR PYTHON
set -euo pipefail
source_dir="$1" work="$2" python="$3"
rm -rf "$work"
mkdir -p "$work"
"$python" -m venv --system-site-packages "$work/venv"
MUON_BUILD_DIR="$work/build" "$work/venv/bin/pip" install --no-index -q "$source_dir"
cd "$work"
"$work/venv/bin/python" - <<'PYTHON'
import sys
import torch
import muon_cpp

assert muon_cpp.__file__.startswith(sys.prefix), muon_cpp.__file__  # the venv's copy
w = torch.nn.Parameter(torch.ones(3, 2))
optimizer = muon_cpp.AdamW([w], lr=0.1, weight_decay=0.01)
w.grad = torch.ones(3, 2)
optimizer.step()
# First AdamW step: W·(1 − lr·λ) − lr·m̂/(√v̂ + eps) with m̂ = v̂ = 1.
expected = 1 * (1 - 0.1 * 0.01) - 0.1 / (1 + 1e-8)
assert torch.allclose(w.detach(), torch.full((3, 2), expected), rtol=0, atol=1e-6), w
print(f"pip-installed muon_cpp {muon_cpp.__file__} against torch {torch.__version__}: OK")
PYTHON
