"""state_dict() / load_state_dict(): bit-exact resume, torch.save round trips, validation."""
import copy
import io

import pytest
import torch

import muon_cpp
from helpers import TinyGpt, batches, train, weights

CONFIG = "optimizer: {name: muon, lr: 0.02, adamw_lr: 0.004, schedule: {name: cosine}}\n"

MAKERS = {
    "hybrid": lambda model: muon_cpp.build_optimizer(model, CONFIG, 20),
    "hybrid_bf16": lambda model: muon_cpp.build_optimizer(
        model, "optimizer: {name: muon, state_dtype: bfloat16}\n", 20),
    "adamw_bf16": lambda model: muon_cpp.AdamW(model.parameters(), state_dtype=torch.bfloat16),
    "muon_normuon": lambda model: muon_cpp.Muon(
        [p for p in model.parameters() if p.dim() == 2 and p.requires_grad],
        normuon=dict(beta2=0.9)),
}


def through_torch_save(state_dict):
    buffer = io.BytesIO()
    torch.save(state_dict, buffer)
    buffer.seek(0)
    return torch.load(buffer)


@pytest.mark.parametrize("kind", sorted(MAKERS))
def test_resume_is_bit_exact(kind):
    torch.manual_seed(0)
    model = TinyGpt()
    optimizer = MAKERS[kind](model)
    data = batches(8)
    train(model, optimizer, data[:4])
    saved_model = copy.deepcopy(model.state_dict())
    saved = through_torch_save(optimizer.state_dict())
    train(model, optimizer, data[4:])

    resumed = TinyGpt()
    resumed.load_state_dict(saved_model)
    resumed_optimizer = MAKERS[kind](resumed)
    resumed_optimizer.load_state_dict(saved)
    train(resumed, resumed_optimizer, data[4:])
    for a, b in zip(weights(model), weights(resumed)):
        assert torch.equal(a, b)
    assert [g["lr"] for g in optimizer.param_groups] == [
        g["lr"] for g in resumed_optimizer.param_groups]


def test_state_dict_layout_is_pytorchs():
    torch.manual_seed(1)
    model = TinyGpt()
    optimizer = muon_cpp.build_optimizer(model, CONFIG, 20)
    train(model, optimizer, batches(2))
    state_dict = optimizer.state_dict()
    assert set(state_dict) == {"state", "param_groups", "counters"}
    assert state_dict["counters"] == {"step_count": 2, "skipped_steps": 0}
    # Each group carries the counters too: torch.distributed.checkpoint keeps only state and
    # param_groups, and a state dict without "counters" resumes the schedules where they were.
    assert all(g["step_count"] == 2 and g["skipped_steps"] == 0
               for g in state_dict["param_groups"])
    del state_dict["counters"]
    fresh = muon_cpp.build_optimizer(model, CONFIG, 20)
    fresh.load_state_dict(state_dict)
    assert fresh.step_count == 2
    assert [g["lr"] for g in fresh.param_groups] == [g["lr"] for g in optimizer.param_groups]
    indices = [i for g in state_dict["param_groups"] for i in g["params"]]
    assert indices == list(range(len(indices)))
    assert sorted(state_dict["state"]) == indices
    entry = state_dict["state"][0]
    assert entry["step"].item() == 2.0


def test_torch_adamw_state_dict_continues_in_ours():
    torch.manual_seed(2)
    ours, theirs = TinyGpt(), TinyGpt()
    theirs.load_state_dict(ours.state_dict())
    data = batches(10)
    torch_opt = torch.optim.AdamW(theirs.parameters(), lr=3e-3)
    train(theirs, torch_opt, data[:5])
    ours.load_state_dict(theirs.state_dict())
    our_opt = muon_cpp.AdamW(ours.parameters(), lr=3e-3)
    our_opt.load_state_dict(torch_opt.state_dict())  # torch's extra keys are kept, unused
    train(ours, our_opt, data[5:])
    train(theirs, torch_opt, data[5:])
    for a, b in zip(weights(ours), weights(theirs)):
        assert (a - b).abs().max() < 1e-5


def test_bad_state_dict_changes_nothing():
    torch.manual_seed(3)
    model = TinyGpt()
    optimizer = muon_cpp.build_optimizer(model, CONFIG, 20)
    train(model, optimizer, batches(2))
    good = copy.deepcopy(optimizer.state_dict())
    before = copy.deepcopy(optimizer.state_dict())

    def expect(error, pattern, state_dict):
        with pytest.raises(error, match=pattern):
            optimizer.load_state_dict(state_dict)
        now = optimizer.state_dict()
        assert now["counters"] == before["counters"]
        assert [{k: v for k, v in g.items() if k != "params"} for g in now["param_groups"]] == [
            {k: v for k, v in g.items() if k != "params"} for g in before["param_groups"]]
        for key, entry in before["state"].items():
            for name, value in entry.items():
                assert torch.equal(now["state"][key][name], value)

    key = next(k for k in good["state"] if "exp_avg" in good["state"][k])  # an AdamW tensor
    wrong_shape = copy.deepcopy(good)
    wrong_shape["param_groups"][0]["lr"] = 123.0  # would change if anything were applied
    wrong_shape["state"][key]["exp_avg"] = torch.zeros(3)
    expect(ValueError, r"state_dict\['state'\]\[\d+\].exp_avg has shape \[3\], this optimizer "
           r"needs", wrong_shape)
    wrong_dtype = copy.deepcopy(good)
    wrong_dtype["state"][key]["exp_avg_sq"] = wrong_dtype["state"][key]["exp_avg_sq"].double()
    expect(ValueError, "exp_avg_sq has dtype Double, this optimizer stores Float", wrong_dtype)
    nan = copy.deepcopy(good)
    nan["state"][key]["exp_avg"] = nan["state"][key]["exp_avg"] * float("nan")
    expect(ValueError, "holds NaN or Inf", nan)
    extra = copy.deepcopy(good)
    extra["state"][key]["momentum"] = torch.zeros(1)
    expect(ValueError, "has 'momentum', which this optimizer does not keep", extra)
    fewer_groups = copy.deepcopy(good)
    fewer_groups["param_groups"].pop()
    expect(ValueError, "parameter groups", fewer_groups)
    no_counters = copy.deepcopy(good)  # neither 'counters' nor the groups' copies
    del no_counters["counters"]
    for group in no_counters["param_groups"]:
        del group["step_count"]
    expect(ValueError, "every param group must hold the same step_count and skipped_steps",
           no_counters)
    disagreeing = copy.deepcopy(good)
    del disagreeing["counters"]
    disagreeing["param_groups"][0]["step_count"] += 1
    expect(ValueError, "or without it every param group must hold the same", disagreeing)
    bad_type = copy.deepcopy(good)
    bad_type["param_groups"][0]["lr"] = "fast"
    expect(TypeError, "lr must be a number, got str 'fast'", bad_type)
    expect(ValueError, "lacks 'state'", {"param_groups": []})
    expect(TypeError, "state_dict must be a dict", [1, 2])
    optimizer.load_state_dict(good)  # and the good one still loads
