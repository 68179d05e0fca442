"""examples/python/ddp_muon.py and fsdp_muon.py under torchrun (docs/distributed.md). CTest
registers this file only where torchrun can start ranks: torch >= 2 with a TCP store built with
libuv (python/CMakeLists.txt; not Debian 12's 1.13 under Python 3.11, not Debian sid's libuv-less
2.14)."""
import os
import pathlib
import subprocess
import sys

import pytest
import torch

from distributed_support import ROUND_OFF, python_path
from torch_features import has_fsdp2, torchrun_can_start

EXAMPLES = pathlib.Path(__file__).resolve().parents[2] / "examples" / "python"


@pytest.mark.skipif(not torchrun_can_start(),
                    reason="needs software: a torchrun that can start ranks with this torch "
                           "(torch_features.torchrun_can_start); CTest does not run this file then")
@pytest.mark.parametrize("example", [
    "ddp_muon.py",
    pytest.param("fsdp_muon.py", marks=pytest.mark.skipif(
        not has_fsdp2(), reason="needs software: FSDP2 (torch 2.6); this torch is " + torch.__version__))])
def test_the_torchrun_examples_train_the_same_model_at_1_2_and_4_ranks(tmp_path, example):
    """The DDP and the FSDP2 example as docs/distributed.md runs them, under torchrun: each rank
    its slice of one global batch, so every world size trains the same model."""
    finals = {}
    for world in (1, 2, 4):
        out = tmp_path / f"params{world}.pt"
        result = subprocess.run(
            [sys.executable, "-m", "torch.distributed.run", "--standalone",
             f"--nproc_per_node={world}", str(EXAMPLES / example), "--steps", "20", "--out",
             str(out)],
            env=dict(os.environ, PYTHONPATH=python_path(), OMP_NUM_THREADS="1"),
            capture_output=True, text=True, timeout=300, check=False)
        output = result.stdout + result.stderr
        assert result.returncode == 0, output
        assert "step 20: loss" in result.stdout, output
        finals[world] = torch.load(out)
    for world in (2, 4):
        for ours, one in zip(finals[world], finals[1]):
            assert ((ours - one).abs().max() / one.abs().max()).item() <= ROUND_OFF
