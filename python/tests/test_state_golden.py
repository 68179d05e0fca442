"""State dicts written by earlier versions load unchanged: tests/data/state_dict_hybrid.pt is a
HybridOptimizer's state_dict() after two steps (written with muon-cpp 0.1.0 on torch 1.13, before
the hybrid's slots and roles had their current names)."""
import pathlib

import torch

import muon_cpp

GOLDEN = pathlib.Path(__file__).resolve().parents[2] / "tests" / "data" / "state_dict_hybrid.pt"


def model_and_optimizer():
    """The model and optimizer the golden file was written from (bf16 state, NorMuon, Lion for
    the others), at fixed weights."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.ReLU(), torch.nn.Linear(8, 8),
                                torch.nn.LayerNorm(8), torch.nn.Linear(8, 8), torch.nn.Linear(8, 3))
    config = "optimizer: {normuon: true, state_dtype: bfloat16, others: lion}\n"
    return model, muon_cpp.build_optimizer(model, config=config)


def two_steps(model, optimizer):
    """Two steps on gradients that depend only on the parameter's position and the step."""
    for step in range(2):
        for i, p in enumerate(model.parameters()):
            p.grad = torch.sin(torch.arange(p.numel(), dtype=torch.float32) * (i + 1) + step
                               ).reshape(p.shape)
        optimizer.step()


def test_a_state_dict_of_an_earlier_version_loads_unchanged():
    saved = torch.load(GOLDEN)
    model, optimizer = model_and_optimizer()
    optimizer.load_state_dict(saved)
    now = optimizer.state_dict()
    assert now["state"].keys() == saved["state"].keys()
    for index, entry in saved["state"].items():
        assert now["state"][index].keys() == entry.keys()
        for key, value in entry.items():
            if isinstance(value, torch.Tensor):
                assert torch.equal(now["state"][index][key], value), (index, key)
            else:
                assert now["state"][index][key] == value, (index, key)
    assert [group["algorithm"] for group in now["param_groups"]] == [
        group["algorithm"] for group in saved["param_groups"]]
    assert {group["algorithm"] for group in saved["param_groups"]} == {"muon", "lion"}
    for ours, theirs in zip(now["param_groups"], saved["param_groups"]):
        assert ours == theirs
    # The entries two steps make here, and the run goes on from the loaded state.
    model_b, straight = model_and_optimizer()
    two_steps(model_b, straight)
    assert straight.state_dict()["state"].keys() == now["state"].keys()
    two_steps(model, optimizer)
