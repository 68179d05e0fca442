"""The step inside backward (muon_cpp.step_in_backward, docs/python.md §The step inside backward):
the bits of the ordinary step for every optimizer class of the conformance suite, with gradient
accumulation and a torch LR scheduler; released gradients; state dicts and resuming across the two
forms; step(closure) and zero_grad(); and the refusals, each naming the setting."""
import pytest
import torch
from torch.optim import lr_scheduler

import muon_cpp
from test_conformance import CASES, Case, matrices, net, others, params_of, same


def loss(model, step):
    generator = torch.Generator().manual_seed(100 + step)
    return (model(torch.randn(5, 6, generator=generator)) - 0.5).square().mean()


def ignoring_nonfinite(case):
    """The case, its hybrids built with nonfinite: ignore (their default, skip, is refused)."""
    if case.name == "HybridOptimizer":
        return Case(case.name, case.algorithms, lambda model: muon_cpp.HybridOptimizer(
            model, {"optimizer": {"lr": 0.02, "nonfinite": "ignore"}}))
    if case.name == "HybridOptimizer(groups)":
        return Case(case.name, case.algorithms, lambda model: muon_cpp.HybridOptimizer(
            [{"params": matrices(model) + others(model)[:2], "weight_decay": 0.1},
             {"params": others(model)[2:], "weight_decay": 0.0}],
            lr=0.02, adamw_lr=3e-3, nonfinite="ignore"))
    return case


IN_BACKWARD = [ignoring_nonfinite(case) for case in CASES]


@pytest.mark.parametrize("every", [1, 2])
@pytest.mark.parametrize("case", IN_BACKWARD, ids=repr)
def test_gives_the_bits_of_the_ordinary_step(case, every):
    ordinary, inside = net(), net()
    ordinary_opt, inside_opt = case.make(ordinary), case.make(inside)
    schedulers = [lr_scheduler.StepLR(o, 3, 0.5) for o in (ordinary_opt, inside_opt)]
    handle = muon_cpp.step_in_backward(inside_opt, every=every)
    for step in range(12):
        ordinary_opt.zero_grad()
        for micro in range(every):
            loss(ordinary, step * every + micro).backward()
        ordinary_opt.step()
        for micro in range(every):
            loss(inside, step * every + micro).backward()
        inside_opt.step()  # the loop unchanged: step() and zero_grad() do nothing here
        inside_opt.zero_grad()
        for scheduler in schedulers:
            scheduler.step()
        assert all(p.grad is None for p in params_of(inside_opt))  # released
    assert same(ordinary, inside)
    assert handle.steps == 12
    assert inside_opt.param_groups[0]["lr"] == ordinary_opt.param_groups[0]["lr"]


@pytest.mark.parametrize("state_dtype", ["int8", "bfloat16"])
def test_low_precision_state_gives_the_bits_of_the_ordinary_step(state_dtype):
    def model():
        torch.manual_seed(1)
        return torch.nn.Sequential(torch.nn.Linear(6, 128), torch.nn.Tanh(), torch.nn.Linear(128, 64))

    ordinary, inside = model(), model()
    ordinary_opt, inside_opt = (muon_cpp.AdamW(m.parameters(), lr=0.01, state_dtype=state_dtype)
                                for m in (ordinary, inside))
    muon_cpp.step_in_backward(inside_opt)
    for step in range(6):
        ordinary_opt.zero_grad()
        loss(ordinary, step).backward()
        ordinary_opt.step()
        loss(inside, step).backward()
    assert same(ordinary, inside)
    if state_dtype == "int8":  # 64 x 128: quantized
        assert inside_opt.state[inside[2].weight]["exp_avg_codes"].dtype == torch.uint8


def test_a_run_switches_between_the_two_forms_on_resume():
    def make(model):
        return muon_cpp.HybridOptimizer(model, {"optimizer": {"lr": 0.02, "nonfinite": "ignore"}})

    straight = net()
    straight_opt = make(straight)
    for step in range(8):
        straight_opt.zero_grad()
        loss(straight, step).backward()
        straight_opt.step()
    for first_inside in (False, True):
        model = net()
        opt = make(model)
        handle = muon_cpp.step_in_backward(opt) if first_inside else None
        for step in range(4):
            opt.zero_grad()
            loss(model, step).backward()
            opt.step()
        saved, weights = opt.state_dict(), {k: v.clone() for k, v in model.state_dict().items()}
        if handle is not None:
            handle.remove()
        resumed = net(seed=9)
        resumed.load_state_dict(weights)
        resumed_opt = make(resumed)
        resumed_opt.load_state_dict(saved)
        if not first_inside:
            muon_cpp.step_in_backward(resumed_opt)
        for step in range(4, 8):
            resumed_opt.zero_grad()
            loss(resumed, step).backward()
            resumed_opt.step()
        assert same(straight, resumed), f"first inside backward: {first_inside}"


def test_step_with_a_closure_runs_it_and_remove_brings_back_gradients():
    model = net()
    opt = muon_cpp.AdamW(model.parameters(), lr=0.01)
    with muon_cpp.step_in_backward(opt) as handle:
        before = model.fc1.weight.clone()

        def closure():
            value = loss(model, 0)
            value.backward()
            return value
        assert isinstance(opt.step(closure), torch.Tensor)
        assert not torch.equal(before, model.fc1.weight) and handle.steps == 1
    loss(model, 1).backward()  # hooks gone: the gradient stays for step()
    assert model.fc1.weight.grad is not None
    opt.zero_grad(set_to_none=True)  # torch's own again
    assert model.fc1.weight.grad is None and opt._in_backward is None


def test_hooks_of_the_user_see_each_gradient_and_no_other_is_held():
    """A hook of the user's after accumulation (torch >= 2.1) sees its parameter's gradient,
    before the step spends it; when a gradient arrives, no other parameter's gradient is held."""
    model = net()
    opt = muon_cpp.HybridOptimizer(model, {"optimizer": {"lr": 0.02, "nonfinite": "ignore"}})
    params = list(model.parameters())
    after_accumulation = hasattr(torch.Tensor, "register_post_accumulate_grad_hook")
    seen, held = [], []
    for p in params:
        p.register_hook(lambda grad: held.append(sum(q.grad is not None for q in params)))
        if after_accumulation:
            p.register_post_accumulate_grad_hook(lambda p: seen.append(p.grad is not None))
    handle = muon_cpp.step_in_backward(opt)
    before = [p.clone() for p in params]
    loss(model, 0).backward()
    assert held == [0] * len(params)
    assert seen == ([True] * len(params) if after_accumulation else [])
    assert all(not torch.equal(b, p) for b, p in zip(before, params)) and handle.steps == 1
    grads = torch.autograd.grad(loss(model, 1), params)  # leaves .grad alone: no step
    assert all(g is not None for g in grads) and handle.steps == 1


def test_refusals_name_what_is_wrong():
    model = net()
    with pytest.raises(TypeError, match="needs a muon_cpp optimizer, got torch.optim.adamw.AdamW"):
        muon_cpp.step_in_backward(torch.optim.AdamW(model.parameters()))
    opt = muon_cpp.AdamW(model.parameters())
    with pytest.raises(TypeError, match="every must be an int"):
        muon_cpp.step_in_backward(opt, every=True)
    with pytest.raises(ValueError, match="every must be >= 1"):
        muon_cpp.step_in_backward(opt, every=0)
    muon_cpp.step_in_backward(opt)
    with pytest.raises(ValueError, match="already steps inside backward; remove"):
        muon_cpp.step_in_backward(opt)
    with pytest.raises(ValueError, match=r"global-norm clipping \(grad_clip 1\).*remove grad_clip"):
        muon_cpp.step_in_backward(muon_cpp.HybridOptimizer(
            net(), {"optimizer": {"grad_clip": 1.0, "nonfinite": "ignore"}}))
    with pytest.raises(ValueError, match="nonfinite: skip judges the whole step.*set nonfinite: "
                                         "ignore"):
        muon_cpp.step_in_backward(muon_cpp.HybridOptimizer(net()))


def test_several_ranks_are_refused(monkeypatch):
    monkeypatch.setattr(torch.distributed, "is_available", lambda: True)
    monkeypatch.setattr(torch.distributed, "is_initialized", lambda: True)
    monkeypatch.setattr(torch.distributed, "get_world_size", lambda group=None: 2)
    with pytest.raises(ValueError, match="runs in one process: with a process group, DDP or FSDP2"):
        muon_cpp.step_in_backward(muon_cpp.AdamW(net().parameters()))


def test_param_groups_changed_while_hooked_are_refused_changing_nothing():
    model = net()
    opt = muon_cpp.AdamW(model.parameters(), lr=0.01)
    muon_cpp.step_in_backward(opt)
    opt.param_groups[0]["params"] = opt.param_groups[0]["params"][:-1]
    before = [p.clone() for p in model.parameters()]
    with pytest.raises(RuntimeError, match="param_groups' tensors changed since step_in_backward"):
        loss(model, 0).backward()
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters()))
