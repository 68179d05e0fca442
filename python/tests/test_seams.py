"""Four ways muon_cpp once failed silently where the training stacks meet it, each as its users met
it (test_conformance.py holds every class to the whole contract; this file keeps the four cases
in the plain form they were found in):

1. a tensor put into param_groups after construction (accelerate's FSDP2 switch) was never
   stepped, nor was the old one;
2. torch.optim's state-dict hooks were accepted and never run;
3. KellerJordan/Muon's use_muon=False groups given to Muon were trained by Muon, Adam's eps taken
   for Newton–Schulz's;
4. HF Trainer's optimizer_cls_and_kwargs construction, cls(groups, **kwargs), was refused."""
import pytest
import torch

import muon_cpp


@pytest.mark.parametrize("cls", [muon_cpp.Muon, muon_cpp.AdamW])
def test_a_tensor_swapped_into_param_groups_is_stepped_and_the_old_one_is_not(cls):
    old = torch.nn.Parameter(torch.randn(4, 3))
    optimizer = cls([old], lr=0.1)
    new = torch.nn.Parameter(old.detach().clone())
    optimizer.param_groups[0]["params"] = [new]  # what accelerate's prepare does under FSDP2
    old.grad, new.grad = torch.ones(4, 3), torch.ones(4, 3)
    old_before = old.detach().clone()
    optimizer.step()
    assert not torch.equal(new.detach(), old_before)
    assert torch.equal(old.detach(), old_before)


def test_state_dict_hooks_run():
    optimizer = muon_cpp.AdamW([torch.nn.Parameter(torch.randn(3))])
    calls = []
    optimizer.register_state_dict_pre_hook(lambda o: calls.append("state_dict pre"))
    optimizer.register_state_dict_post_hook(lambda o, sd: calls.append("state_dict post"))
    optimizer.register_load_state_dict_pre_hook(lambda o, sd: calls.append("load pre"))
    optimizer.register_load_state_dict_post_hook(lambda o: calls.append("load post"))
    optimizer.load_state_dict(optimizer.state_dict())
    assert calls == ["state_dict pre", "state_dict post", "load pre", "load post"]


def test_keller_jordans_adam_groups_are_not_trained_by_muon():
    hidden = torch.nn.Parameter(torch.randn(8, 8, dtype=torch.float64))
    embedding = torch.nn.Parameter(torch.randn(16, 8, dtype=torch.float64))
    groups = [dict(params=[hidden], use_muon=True, lr=0.02),
              dict(params=[embedding], use_muon=False, lr=3e-4, betas=(0.8, 0.95), eps=1e-10)]
    with pytest.raises(ValueError, match="use_muon.*muon_cpp.MuonWithAuxAdam"):
        muon_cpp.Muon([dict(g) for g in groups])
    optimizer = muon_cpp.MuonWithAuxAdam([dict(g) for g in groups])
    embedding.grad, hidden.grad = torch.ones_like(embedding), torch.ones_like(hidden)
    before = embedding.detach().clone()
    optimizer.step()
    # Adam's first step moves every entry by lr (the bias-corrected m / sqrt(v) is 1).
    assert torch.allclose(before - embedding.detach(), torch.full_like(before, 3e-4), rtol=0,
                          atol=1e-12)


def test_hf_trainers_construction_builds_the_hybrid():
    model = torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.LayerNorm(8),
                                torch.nn.Linear(8, 3))
    decay = [model[0].weight, model[2].weight]
    others = [model[0].bias, model[1].weight, model[1].bias, model[2].bias]
    # transformers' Trainer.create_optimizer: optimizer_cls(groups, **optimizer_kwargs)
    optimizer = muon_cpp.HybridOptimizer([{"params": decay, "weight_decay": 0.01},
                                          {"params": others, "weight_decay": 0.0}],
                                         **{"lr": 0.02, "adamw_lr": 3e-4})
    roles = [(r["role"], r["weight_decay"]) for r in optimizer.report()]
    assert roles == [("matrices", 0.01), ("matrices", 0.01)] + [("others", 0.0)] * 4
