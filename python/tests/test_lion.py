"""muon_cpp.Lion against the paper's update written here, with lion-pytorch's keywords."""
import copy

import torch

import muon_cpp
from helpers import TinyGpt, batches, max_rel_diff, train, weights


def reference_lion(params, grads_per_step, lr, betas, weight_decay):
    """arXiv 2302.06675, Algorithm 2, in float64."""
    b1, b2 = betas
    params = [p.detach().clone() for p in params]
    moments = [torch.zeros_like(p) for p in params]
    for grads in grads_per_step:
        for i, g in enumerate(grads):
            c = b1 * moments[i] + (1 - b1) * g
            params[i] = params[i] * (1 - lr * weight_decay) - lr * torch.sign(c)
            moments[i] = b2 * moments[i] + (1 - b2) * g
    return params, moments


def test_lion_equals_the_papers_update_with_two_groups():
    torch.manual_seed(0)
    a = torch.nn.Parameter(torch.randn(7, 5, dtype=torch.float64))
    b = torch.nn.Parameter(torch.randn(9, dtype=torch.float64))
    start = [a.detach().clone(), b.detach().clone()]
    optimizer = muon_cpp.Lion([{"params": [a]}, {"params": [b], "lr": 3e-3, "weight_decay": 0.0}],
                              3e-4, (0.95, 0.98), 0.5)
    grads = [[torch.randn(7, 5, dtype=torch.float64), torch.randn(9, dtype=torch.float64)]
             for _ in range(8)]
    for step in grads:
        a.grad, b.grad = step[0].clone(), step[1].clone()
        optimizer.step()
    ref_a, m_a = reference_lion([start[0]], [[g[0]] for g in grads], 3e-4, (0.95, 0.98), 0.5)
    ref_b, _ = reference_lion([start[1]], [[g[1]] for g in grads], 3e-3, (0.95, 0.98), 0.0)
    assert max_rel_diff(a.detach(), ref_a[0]) < 1e-14
    assert max_rel_diff(b.detach(), ref_b[0]) < 1e-14
    assert max_rel_diff(optimizer.state[a]["exp_avg"], m_a[0]) < 1e-14
    assert optimizer.param_groups[0]["betas"] == (0.95, 0.98)
    assert optimizer.param_groups[1]["lr"] == 3e-3


def test_defaults_are_lion_pytorchs():
    optimizer = muon_cpp.Lion([torch.nn.Parameter(torch.zeros(3))])
    group = optimizer.param_groups[0]
    assert (group["lr"], group["betas"], group["weight_decay"]) == (1e-4, (0.9, 0.99), 0.0)


def test_state_dict_resumes_as_if_uninterrupted_and_bf16_state_is_bf16():
    torch.manual_seed(1)
    straight, resumed = TinyGpt(), TinyGpt()
    resumed.load_state_dict(straight.state_dict())
    settings = dict(lr=1e-3, weight_decay=0.1, state_dtype=torch.bfloat16)
    data = batches(10, seed=2)
    first = muon_cpp.Lion(straight.parameters(), **settings)
    train(straight, first, data[:5])
    saved = copy.deepcopy(first.state_dict())
    train(straight, first, data[5:])
    train(resumed, muon_cpp.Lion(resumed.parameters(), **settings), data[:5])
    again = muon_cpp.Lion(resumed.parameters(), **settings)
    again.load_state_dict(saved)
    train(resumed, again, data[5:])
    for a, b in zip(weights(straight), weights(resumed)):
        assert torch.equal(a, b)
    assert first.state[straight.wte.weight]["exp_avg"].dtype == torch.bfloat16


def test_a_scheduler_drives_lions_rate():
    torch.manual_seed(3)
    w = torch.nn.Parameter(torch.zeros(4))
    optimizer = muon_cpp.Lion([w], lr=0.1)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 0.5 ** step)
    for _ in range(3):
        w.grad = torch.ones(4)
        optimizer.step()
        scheduler.step()
    # Each step moves every entry by its rate against the gradient's sign: 0.1 + 0.05 + 0.025.
    assert torch.allclose(w.detach(), torch.full((4,), -0.175), rtol=0, atol=1e-7)
