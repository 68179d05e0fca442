"""A muon-cpp checkpoint is readable from Python with torch.load (docs/design.md §Checkpoints).

Usage: /usr/bin/python3 tests/python/load_checkpoint.py build/tests/cli_train/checkpoint.pt
"""
import sys

import torch

from torch_checkpoint import load_checkpoint

checkpoint = load_checkpoint(sys.argv[1])
assert checkpoint["format"] == "muon-cpp checkpoint", checkpoint.get("format")
assert checkpoint["version"] == 2
assert checkpoint["step_count"] == 40, checkpoint["step_count"]
state = checkpoint["state"]
q = state["blocks.0.attn.q_proj.weight"]
assert q["role"] == "matrices" and q["has_state"] and q["step"] == 40
assert q["momentum_buffer"].shape == (32, 32) and q["momentum_buffer"].dtype == torch.float32
wte = state["wte.weight"]
assert wte["role"] == "others" and wte["exp_avg"].shape == (256, 32)
model = checkpoint["model"]
assert torch.equal(model["wte.weight"], model["lm_head.weight"])  # tied, saved under both names
assert all(torch.isfinite(t).all() for t in model.values())
print(f"torch.load read {len(state)} optimizer states and {len(model)} model tensors: OK")
