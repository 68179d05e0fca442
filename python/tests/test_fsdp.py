"""muon_cpp's optimizers on parameters sharded by FSDP2 (fully_shard: DTensors, Shard(0); see
docs/distributed.md §Python: parameters sharded by FSDP2). At 1, 2 and 4 ranks (Gloo on the CPU,
each rank a process of python/tests/fsdp_ranks.py) the whole parameters after every step, the
state dict, a sharded run resumed from a one-process state dict, and one resumed from a
torch.distributed.checkpoint saved at another world size equal an unsharded one-process run.
CTest registers this file only where the interpreter's torch has FSDP2 (python/CMakeLists.txt)."""
import gc
import json

import pytest
import torch
import torch.distributed as dist

import muon_cpp
from distributed_support import ROUND_OFF, run_ranks
from torch_features import has_fsdp2

pytestmark = pytest.mark.skipif(
    not has_fsdp2(), reason="needs software: FSDP2 (torch.distributed.fsdp.fully_shard) arrived in torch 2.6; "
                            "this torch is " + torch.__version__ + " (CTest does not run this "
                            "file then)")

FSDP_RANKS = __import__("pathlib").Path(__file__).with_name("fsdp_ranks.py")


@pytest.mark.parametrize("world", [1, 2, 4])
@pytest.mark.parametrize("algorithm",
                         ["muon", "dion", "adamw", "adamw_int8", "lamb", "lion", "hybrid"])
def test_sharded_parameters_step_as_one_process_does(tmp_path, world, algorithm):
    """Muon, Dion, Lamb and the hybrid of build_optimizer (whole tensors: one owner each,
    gathered and scattered back; the hybrid clipping on the norm of all ranks' gradients and
    QK-clipping on their largest logits) and AdamW and Lion (each rank its own rows) give what one
    process gives the unsharded tensors."""
    run_ranks(tmp_path, world, algorithm, 4, tmp_path, script=FSDP_RANKS)
    reports = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(world)]
    if world == 4:  # the (5,) vector leaves the last rank no rows: 2, 2, 1, 0
        assert [r["rows"][-1] for r in reports] == [[2], [2], [1], [0]]
    whole = algorithm in ("muon", "dion", "lamb", "hybrid")
    for i in range(len(reports[0]["owned"])):
        updaters = sum(r["owned"][i] for r in reports)
        assert updaters == (1 if whole else world), (i, reports)
    for report in reports:
        # Muon's owners batch other sets of same-shape matrices than one process: round-off.
        assert max(report["steps"]) <= (ROUND_OFF if whole else 0.0), report
        assert report["state"] <= (ROUND_OFF if whole else 0.0), report
        assert report["resumed"] <= (ROUND_OFF if whole else 0.0), report


@pytest.mark.parametrize("algorithm", ["muon", "adamw", "hybrid", "aux_adam"])
def test_parameters_accelerate_swaps_for_sharded_ones_are_stepped_as_one_process_does(
        tmp_path, algorithm):
    """accelerate's prepare with FSDP2 builds nothing anew: it swaps the optimizer's tensors for
    the module's DTensors in param_groups (fsdp_ranks.py transcribes its steps; accelerate itself
    runs FSDP2 on GPUs only — on the CPU it falls back to DDP). The next step shards the
    optimizer over them (fresh state for the new tensors), and 2 ranks step as one process."""
    run_ranks(tmp_path, 2, "accelerate:" + algorithm, 3, tmp_path, script=FSDP_RANKS)
    reports = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]
    whole = algorithm != "adamw"
    for i in range(len(reports[0]["owned"])):
        assert sum(r["owned"][i] for r in reports) == (1 if whole else 2), (i, reports)
    for report in reports:
        assert max(report["steps"]) <= (ROUND_OFF if whole else 0.0), report
        assert report["state"] <= (ROUND_OFF if whole else 0.0), report


@pytest.mark.parametrize("algorithm, saved_at, loaded_at",
                         [("muon", 2, 4), ("dion", 2, 1), ("adamw", 4, 1), ("adamw_int8", 4, 2),
                          ("lamb", 1, 2), ("lion", 2, 4), ("hybrid", 4, 2)])
def test_distributed_checkpoint_of_sharded_parameters_resumes_at_another_world_size(
        tmp_path, algorithm, saved_at, loaded_at):
    """Half the steps sharded over one world size, saved with torch.distributed.checkpoint
    (get_optimizer_state_dict of the sharded module); loaded at another (set_optimizer_state_dict)
    and run to the end: the whole parameters equal a one-process run that never stopped."""
    run_ranks(tmp_path, saved_at, "dcp-save:" + algorithm, 6, tmp_path, script=FSDP_RANKS)
    (tmp_path / "rendezvous").unlink(missing_ok=True)
    run_ranks(tmp_path, loaded_at, "dcp-load:" + algorithm, 6, tmp_path, script=FSDP_RANKS)
    for rank in range(loaded_at):
        report = json.loads((tmp_path / f"rank{rank}.json").read_text())
        assert report["resumed"] <= ROUND_OFF, report


def test_int8_state_whose_shards_would_keep_none_is_refused_on_every_rank(tmp_path):
    """A parameter with int8 state whole (2 x 3000) whose rows alone fall under the 4096-element
    threshold: its state would differ in kind between ranks, so every rank refuses it by name."""
    run_ranks(tmp_path, 2, "int8-shards", 0, tmp_path, script=FSDP_RANKS)
    for rank in range(2):
        error = json.loads((tmp_path / f"rank{rank}.json").read_text())["error"]
        assert error is not None and error.startswith("AdamW: parameter 0 of shape (2, 3000) keeps "
                                                      "int8 state whole, but its rows on rank 0 of 2 "
                                                      "((1, 3000)) do not"), error
        assert "give it a param group with state_dtype float32" in error


def test_a_sharded_rank_that_exits_mid_run_is_an_error_on_the_others_not_a_hang(tmp_path):
    """The last of 3 ranks exits after its first step: the next step of the others, gathering
    rows to an owner, raises a RuntimeError naming the collective and this rank within the group's
    10 s timeout."""
    run_ranks(tmp_path, 3, "killed", 0, tmp_path, timeout=120, check=False, script=FSDP_RANKS)
    for rank in (0, 1):
        report = json.loads((tmp_path / f"rank{rank}.json").read_text())
        assert report["error"] is not None, report
        assert "muon_cpp: the gathering of sharded parameters to their owner failed on rank " \
               f"{rank} of 3" in report["error"], report
        assert "another rank exited, hung past the process group's timeout" in report["error"]
        assert report["seconds"] < 10 + 20, report


@pytest.fixture
def one_rank(tmp_path):
    dist.init_process_group("gloo", init_method="file://" + str(tmp_path / "rendezvous"),
                            rank=0, world_size=1)
    yield
    gc.collect()  # the tests' sharded modules, before their group goes (fsdp_ranks.py says why)
    dist.destroy_process_group()


def sharded_linear(mesh):
    from torch.distributed.fsdp import fully_shard
    model = torch.nn.Linear(4, 3)
    fully_shard(model, mesh=mesh)
    return model


def test_sharded_parameters_are_checked_before_anything_is_built(one_rank):
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Replicate, distribute_tensor
    mesh = init_device_mesh("cpu", (1,))
    model = sharded_linear(mesh)
    plain = torch.nn.Parameter(torch.zeros(3, 4))
    with pytest.raises(ValueError, match=r"Muon: 1 of the 2 parameters are DTensors \(FSDP2's "
                                         r"fully_shard\) and the others plain tensors; shard the "
                                         "whole model"):
        muon_cpp.Muon([model.weight, plain])
    replicated = torch.nn.Parameter(distribute_tensor(torch.zeros(3, 4), mesh, [Replicate()]))
    with pytest.raises(ValueError, match=r"AdamW: parameter 1 is placed \(Replicate\(\),\); "
                                         r"muon_cpp takes Shard\(0\)"):
        muon_cpp.AdamW([model.weight, replicated])
    mesh2 = init_device_mesh("cpu", (1, 1))
    flat = torch.nn.Parameter(distribute_tensor(torch.zeros(3, 4), mesh2,
                                                [Replicate(), Replicate()]))
    with pytest.raises(ValueError, match="Lion: parameter 0 lives on a 2-D device mesh; muon_cpp "
                                         "takes parameters sharded over a 1-D mesh"):
        muon_cpp.Lion([flat])
    with pytest.raises(ValueError, match=r"build_optimizer: 1 of the 2 parameters are DTensors "
                                         r"\(FSDP2's fully_shard\) and the others plain tensors"):
        muon_cpp.build_optimizer([("weight", model.weight), ("plain", plain)], None, 10)
    hybrid = muon_cpp.build_optimizer(model, {"optimizer": {"name": "muonclip"}}, 10)

    class Foreign:  # QK-clip weights that are not the model's
        def qk_clip_targets(self):
            return [{"layer": "attn", "q_weight": plain, "k_weight": model.weight, "n_heads": 1,
                     "n_kv_heads": 1, "head_dim": 3}]

        def qk_max_logits(self):
            return {"attn": torch.tensor([1.0])}

    hybrid.set_qk_clip_source(Foreign())
    with pytest.raises(ValueError, match="set_qk_clip_source: layer 'attn''s q_weight is not one "
                                         "of this optimizer's parameters"):
        hybrid.step()
    optimizer = muon_cpp.AdamW(model.parameters())
    with pytest.raises(ValueError, match=r"AdamW: 2 of the 3 parameters are DTensors \(FSDP2's "
                                         r"fully_shard\) and the others plain tensors"):
        optimizer.add_param_group({"params": [plain]})
    assert len(optimizer.param_groups) == 1


def test_a_sharded_parameter_moved_after_the_optimizer_was_built_is_an_error(one_rank):
    from torch.distributed.device_mesh import init_device_mesh
    model = sharded_linear(init_device_mesh("cpu", (1,)))
    optimizer = muon_cpp.Muon([model.weight])
    before = model.weight.full_tensor().clone()
    model.weight.to_local().grad = None
    model(torch.randn(2, 4)).sum().backward()
    optimizer.step()  # a real FSDP2 step: the weight moves
    assert not torch.equal(model.weight.full_tensor(), before)
    with torch.no_grad():  # the rows now in other memory, as a second fully_shard or .to() does
        model.weight._local_tensor = model.weight._local_tensor.clone()
    moved = model.weight.full_tensor().clone()
    with pytest.raises(RuntimeError, match="a sharded parameter's local tensor was replaced "
                                           "after the optimizer was built"):
        optimizer.step()
    assert torch.equal(model.weight.full_tensor(), moved)


def test_the_sharded_hybrid_routes_and_steps_as_the_unsharded_one(one_rank):
    """A frozen parameter keeps its stand-in (no rank holds it whole) and is left alone; routing
    and the values after a step are the unsharded hybrid's."""
    import copy
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    torch.manual_seed(0)
    plain = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Linear(8, 8),
                                torch.nn.Linear(8, 3))
    plain[0].weight.requires_grad_(False)
    sharded = copy.deepcopy(plain)
    fully_shard(sharded, mesh=init_device_mesh("cpu", (1,)))
    ours = muon_cpp.build_optimizer(sharded, {"optimizer": {"grad_clip": 0.1}}, 10)
    reference = muon_cpp.build_optimizer(plain, {"optimizer": {"grad_clip": 0.1}}, 10)
    assert [(r["name"], r["role"]) for r in ours.report()] == [
        (r["name"], r["role"]) for r in reference.report()]
    assert "frozen" in [r["role"] for r in ours.report()]
    x = torch.randn(5, 4)
    for model, optimizer in ((plain, reference), (sharded, ours)):
        model(x).square().sum().backward()
        optimizer.step()
    assert ours.last_step["clip_factor"] < 1
    for p, q in zip(plain.parameters(), sharded.parameters()):
        assert torch.equal(p.detach(), q.full_tensor().detach())
