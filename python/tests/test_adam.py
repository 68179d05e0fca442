"""muon_cpp's Adam family against torch.optim on an nn.Module, schedulers included."""
import pytest
import torch

import muon_cpp
from helpers import TinyGpt, batches, max_rel_diff, train, weights


def twin_models():
    torch.manual_seed(0)
    ours = TinyGpt()
    theirs = TinyGpt()
    theirs.load_state_dict(ours.state_dict())
    return ours, theirs


def assert_same_weights(ours, theirs, tolerance):
    for a, b in zip(weights(ours), weights(theirs)):
        assert max_rel_diff(a, b) < tolerance


def test_adamw_equals_torch_adamw_over_100_steps():
    ours, theirs = twin_models()
    settings = dict(lr=3e-3, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1)
    data = batches(100)
    train(ours, muon_cpp.AdamW(ours.parameters(), **settings), data)
    train(theirs, torch.optim.AdamW(theirs.parameters(), **settings), data)
    # Same formulas in another order: float32 rounding only, after 100 steps.
    assert_same_weights(ours, theirs, 2e-5)


def test_adam_equals_torch_adam_with_coupled_weight_decay():
    ours, theirs = twin_models()
    settings = dict(lr=2e-3, betas=(0.8, 0.99), eps=1e-7, weight_decay=0.05)
    data = batches(60, seed=1)
    train(ours, muon_cpp.Adam(ours.parameters(), **settings), data)
    train(theirs, torch.optim.Adam(theirs.parameters(), **settings), data)
    assert_same_weights(ours, theirs, 2e-5)


@pytest.mark.parametrize("make_scheduler", [
    lambda opt: torch.optim.lr_scheduler.LambdaLR(opt, lambda step: 1.0 / (1 + step)),
    lambda opt: torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=30),
])
def test_lr_schedulers_drive_every_group(make_scheduler):
    ours, theirs = twin_models()

    def groups(model):  # two groups with different rates: decayed matrices, the rest
        matrices = [p for p in model.parameters() if p.dim() == 2]
        others = [p for p in model.parameters() if p.dim() != 2]
        return [{"params": matrices}, {"params": others, "lr": 1e-3, "weight_decay": 0.0}]

    our_opt = muon_cpp.AdamW(groups(ours), lr=5e-3)
    their_opt = torch.optim.AdamW(groups(theirs), lr=5e-3)
    our_schedule, their_schedule = make_scheduler(our_opt), make_scheduler(their_opt)
    data = batches(30, seed=2)
    train(ours, our_opt, data, our_schedule)
    train(theirs, their_opt, data, their_schedule)
    assert [g["lr"] for g in our_opt.param_groups] == [g["lr"] for g in their_opt.param_groups]
    assert our_opt.param_groups[0]["lr"] != 5e-3  # the schedule moved it
    assert_same_weights(ours, theirs, 2e-5)


def test_lamb_equals_reference():
    torch.manual_seed(3)
    w = torch.nn.Parameter(torch.randn(7, 5, dtype=torch.float64))
    ref = w.detach().clone()
    lr, (b1, b2), eps, wd = 0.01, (0.9, 0.999), 1e-6, 0.1
    optimizer = muon_cpp.Lamb([w], lr=lr, betas=(b1, b2), eps=eps, weight_decay=wd)
    m = torch.zeros_like(ref)
    v = torch.zeros_like(ref)
    for t in range(1, 6):
        g = torch.randn(7, 5, dtype=torch.float64)
        w.grad = g.clone()
        optimizer.step()
        m = b1 * m + (1 - b1) * g
        v = b2 * v + (1 - b2) * g * g
        r = (m / (1 - b1 ** t)) / ((v / (1 - b2 ** t)).sqrt() + eps) + wd * ref
        ref = ref - lr * (ref.norm() / r.norm()) * r
    assert max_rel_diff(w.detach(), ref) < 1e-12


def test_bf16_state_is_bf16_and_trains_like_fp32():
    ours, theirs = twin_models()
    data = batches(40, seed=4)
    bf16 = muon_cpp.AdamW(ours.parameters(), lr=3e-3, state_dtype=torch.bfloat16)
    train(ours, bf16, data)
    train(theirs, muon_cpp.AdamW(theirs.parameters(), lr=3e-3), data)
    state = bf16.state[ours.wte.weight]
    assert state["exp_avg"].dtype == torch.bfloat16
    assert state["exp_avg_sq"].dtype == torch.bfloat16
    assert bf16.param_groups[0]["state_dtype"] == torch.bfloat16
    # Stochastic rounding keeps the trajectory close to fp32 state's.
    for a, b in zip(weights(ours), weights(theirs)):
        assert (a - b).abs().max() < 5e-3


def test_add_param_group_keeps_state():
    torch.manual_seed(5)
    a = torch.nn.Parameter(torch.randn(4, 3))
    b = torch.nn.Parameter(torch.randn(3))
    optimizer = muon_cpp.AdamW([a], lr=0.1)
    a.grad = torch.ones(4, 3)
    optimizer.step()
    momentum = optimizer.state[a]["exp_avg"].clone()
    optimizer.add_param_group({"params": [b], "lr": 0.5, "weight_decay": 0.0})
    assert optimizer.param_groups[1]["lr"] == 0.5
    assert torch.equal(optimizer.state[a]["exp_avg"], momentum)
    before = b.detach().clone()
    b.grad = torch.ones(3)
    optimizer.step()
    # First Adam step moves each entry by lr (sign of the gradient): the new group's rate.
    assert torch.allclose(before - b.detach(), torch.full((3,), 0.5), atol=1e-4)
    assert optimizer.state[a]["step"].item() == 2


@pytest.mark.parametrize("cls, settings", [(muon_cpp.AdamW, dict(lr=1e-3, weight_decay=0.1)),
                                           (muon_cpp.Muon, dict(lr=0.02, weight_decay=0.1))])
def test_mantissa_tracking_trains_bf16_weights_as_their_fp32_master(cls, settings):
    """A bf16 parameter with mantissa_tracking against the same optimizer on an fp32 master
    given the same bf16 gradients: its weight and mantissa are the master's two halves exactly;
    the master itself follows torch.optim.AdamW (for AdamW)."""
    generator = torch.Generator().manual_seed(3)
    bf16 = torch.nn.Parameter(torch.randn(16, 12, generator=generator).bfloat16())
    master = torch.nn.Parameter(bf16.detach().float())
    torch_master = torch.nn.Parameter(bf16.detach().float())
    ours = cls([bf16], mantissa_tracking=True, **settings)
    theirs = cls([master], **settings)
    reference = torch.optim.AdamW([torch_master], **settings) if cls is muon_cpp.AdamW else None
    for _ in range(6):
        grad = torch.randn(16, 12, generator=generator).bfloat16()
        bf16.grad, master.grad, torch_master.grad = grad, grad.float(), grad.float()
        for optimizer in (ours, theirs, reference):
            if optimizer is not None:
                optimizer.step()
        mantissa = ours.state[bf16]["mantissa"]
        assert mantissa.dtype == torch.int16
        bits = (bf16.detach().view(torch.int16).int() << 16) | (mantissa.int() & 0xFFFF)
        assert torch.equal(bits.view(torch.float32), master.detach())
    if reference is not None:
        assert max_rel_diff(master.detach(), torch_master.detach()) < 1e-6
    # The state dict carries the mantissa and a reload continues the same run.
    saved = ours.state_dict()
    assert saved["state"][0]["mantissa"].shape == (16, 12)
    again = cls([torch.nn.Parameter(bf16.detach().clone())], mantissa_tracking=True, **settings)
    again.load_state_dict(saved)
    assert torch.equal(again.state_dict()["state"][0]["mantissa"], saved["state"][0]["mantissa"])
