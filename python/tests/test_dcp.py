"""torch.distributed.checkpoint (get/set_optimizer_state_dict, torch >= 2.2) with the optimizers
over a process group: saved at one world size, loaded at another (docs/distributed.md). CTest
registers this file only where the interpreter's torch has that API (python/CMakeLists.txt)."""
import json

import pytest
import torch

from distributed_support import ROUND_OFF, run_ranks
from torch_features import has_dcp_state_dict


@pytest.mark.skipif(not has_dcp_state_dict(),
                    reason="needs software: torch.distributed.checkpoint.state_dict (get/set_optimizer_state_dict) "
                           "arrived in torch 2.2; this torch is " + torch.__version__ + " (CTest "
                           "does not run this file then)")
@pytest.mark.parametrize("algorithm, saved_at, loaded_at",
                         [("muon", 2, 4), ("muon", 4, 1), ("adamw", 2, 1), ("hybrid", 2, 1)])
def test_distributed_checkpoint_resumes_at_another_world_size(tmp_path, algorithm, saved_at,
                                                              loaded_at):
    """Half the steps at one world size, saved with torch.distributed.checkpoint; loaded at
    another and run to the end: the parameters equal a one-process run that never stopped."""
    run_ranks(tmp_path, saved_at, "dcp-save:" + algorithm, 6, tmp_path)
    (tmp_path / "rendezvous").unlink(missing_ok=True)
    run_ranks(tmp_path, loaded_at, "dcp-load:" + algorithm, 6, tmp_path)
    for rank in range(loaded_at):
        report = json.loads((tmp_path / f"rank{rank}.json").read_text())
        assert report["resumed"] <= ROUND_OFF, report
