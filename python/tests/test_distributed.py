"""muon_cpp's optimizers over a torch.distributed process group (docs/distributed.md): at 1, 2
and 4 ranks (Gloo on the CPU, each rank a process of python/tests/distributed_ranks.py) the
parameters after every step, the gathered state dict and a run resumed from a one-process state
dict equal the one-process optimizer's within float32 round-off, and every parameter is updated
by exactly one rank."""
import json

import pytest
import torch
import torch.distributed as dist

import muon_cpp
from distributed_support import ROUND_OFF, run_ranks

@pytest.mark.parametrize("world", [1, 2, 4])
@pytest.mark.parametrize("algorithm", ["muon", "dion", "adamw", "lamb", "lion", "hybrid",
                                       "aux_adam", "swap:muon", "swap:adamw", "swap:aux_adam"])
def test_ranks_equal_one_process(tmp_path, world, algorithm):
    """`swap:`: a tensor put into param_groups between steps is planned with the others and
    stepped from fresh state there, as in one process."""
    run_ranks(tmp_path, world, algorithm, 4, tmp_path)
    reports = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(world)]
    owners = [sum(r["owned"][i] for r in reports) for i in range(len(reports[0]["owned"]))]
    assert owners == [1] * len(owners)  # each parameter updated by one rank
    if world > 1:  # and the work shared
        assert all(any(r["owned"]) for r in reports)
    for report in reports:
        assert max(report["steps"]) <= ROUND_OFF, report
        assert report["state"] <= ROUND_OFF, report
        assert report["resumed"] <= ROUND_OFF, report


def test_a_script_may_end_right_after_a_step(tmp_path):
    """Ranks that step and end at once, the main thread holding the GIL to the end, exit cleanly.
    The collectives run in C++ over aliases no Python object owns: a worker thread of the backend
    that released a tensor Python made would need the GIL of an exiting interpreter, and recent
    PyTorch aborts the process then ("terminate called without an active exception", which some
    of these runs printed while the collectives went through torch.distributed's functions)."""
    for attempt in range(3):
        (tmp_path / str(attempt)).mkdir()
        run_ranks(tmp_path / str(attempt), 4, "ends-after-step", 0, tmp_path)


def test_a_rank_that_exits_mid_run_is_an_error_on_the_others_not_a_hang(tmp_path):
    """The last of 3 ranks exits after its first step: the next step of the others raises a
    RuntimeError naming the collective and this rank, within the group's 10 s timeout."""
    run_ranks(tmp_path, 3, "killed", 0, tmp_path, timeout=120, check=False)
    for rank in (0, 1):
        report = json.loads((tmp_path / f"rank{rank}.json").read_text())
        assert report["error"] is not None, report
        assert f"failed on rank {rank} of 3" in report["error"], report
        assert "another rank exited, hung past the process group's timeout" in report["error"]
        assert report["seconds"] < 10 + 20, report


def test_a_process_group_needs_torch_distributed_and_plans_groups_added_later(tmp_path):
    p = torch.nn.Parameter(torch.randn(4, 3))
    with pytest.raises(ValueError, match="process_group: torch.distributed is not initialized; "
                                         "call torch.distributed.init_process_group first"):
        muon_cpp.Muon([p], process_group=object())
    dist.init_process_group("gloo", init_method="file://" + str(tmp_path / "rendezvous"),
                            rank=0, world_size=1)
    try:
        optimizer = muon_cpp.AdamW([p], process_group=dist.group.WORLD)
        added = torch.nn.Parameter(torch.zeros(2))
        optimizer.add_param_group({"params": [added], "lr": 0.5})  # planned with the others
        p.grad, added.grad = torch.ones_like(p), torch.ones_like(added)
        optimizer.step()
        assert torch.allclose(added.detach(), torch.full((2,), -0.5))  # AdamW's first step: -lr
        assert optimizer._plan.owns(added) and optimizer._plan.owns(p)
        model = torch.nn.Linear(3, 2)
        with pytest.raises(ValueError, match="timeout must be > 0 seconds, got 0"):
            muon_cpp.build_optimizer(model, None, 10, process_group=dist.group.WORLD, timeout=0)
        with pytest.raises(TypeError, match="timeout must be a datetime.timedelta or a number"):
            muon_cpp.build_optimizer(model, None, 10, process_group=dist.group.WORLD, timeout="1m")
    finally:
        dist.destroy_process_group()
