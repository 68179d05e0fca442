"""muon_cpp.Dion against Algorithm 1 of the Dion paper (Ahn et al., arXiv 2504.05295), written out here with torch: one matrix at a time in float64, the power
iteration's basis from torch.linalg.qr (its column signs cancel in P·Qᵀ)."""
import io
import math

import pytest
import torch

import muon_cpp
from helpers import max_rel_diff


def documented_initial_q(shape, index):
    """Q before the first step, as docs/design.md §Dion says: standard normal, drawn in float64
    by a CPU generator seeded with 0x44696f6e + the parameter's position."""
    generator = torch.Generator().manual_seed(0x44696F6E + index)
    return torch.randn(shape, generator=generator, dtype=torch.float64)


class ReferenceDion:
    def __init__(self, shape, rank, lr, mu, weight_decay, index=0):
        self.lr, self.mu, self.weight_decay = lr, mu, weight_decay
        self.momentum = torch.zeros(shape, dtype=torch.float64)
        self.q = documented_initial_q((min(shape), rank), index)

    def step(self, weight, grad):
        rows, cols = weight.shape
        flip = rows < cols
        self.momentum = self.momentum + grad
        b = self.momentum.T if flip else self.momentum
        p, _ = torch.linalg.qr(b @ self.q)
        r = b.T @ p
        b = b - (1 - self.mu) * p @ r.T
        self.momentum = b.T if flip else b
        self.q = r / (r.norm(dim=0, keepdim=True) + 1e-8)
        update = p @ self.q.T
        update = update.T if flip else update
        return (weight * (1 - self.lr * self.weight_decay)
                - self.lr * math.sqrt(rows / cols) * update)


def gradients(shape, steps, seed):
    generator = torch.Generator().manual_seed(seed)
    return [torch.randn(shape, generator=generator, dtype=torch.float64) for _ in range(steps)]


@pytest.mark.parametrize("shape,rank_fraction,rank_multiple_of,rank", [
    ((12, 8), 1.0, 1, 8), ((12, 8), 0.5, 1, 4), ((8, 12), 0.3, 2, 4), ((10, 10), 0.4, 1, 4)])
@pytest.mark.parametrize("dtype,tolerance", [(torch.float64, 1e-10), (torch.float32, 2e-5)])
def test_dion_equals_the_papers_algorithm(shape, rank_fraction, rank_multiple_of, rank, dtype,
                                          tolerance):
    torch.manual_seed(3)
    start = torch.randn(shape, dtype=torch.float64)
    ours = torch.nn.Parameter(start.to(dtype, copy=True))
    optimizer = muon_cpp.Dion([ours], lr=0.05, weight_decay=0.1, rank_fraction=rank_fraction,
                              rank_multiple_of=rank_multiple_of)
    reference = ReferenceDion(shape, rank, lr=0.05, mu=0.95, weight_decay=0.1)
    expected = start
    for grad in gradients(shape, 4, seed=4):
        ours.grad = grad.to(dtype)
        optimizer.step()
        expected = reference.step(expected, grad)
    assert max_rel_diff(ours.detach(), expected) < tolerance
    state = optimizer.state[ours]
    assert set(state) == {"step", "momentum_buffer", "dion_q"}
    assert state["dion_q"].shape == (min(shape), rank)
    assert max_rel_diff(state["momentum_buffer"], reference.momentum) < 10 * tolerance


def test_dion_has_its_own_options_with_microsoft_dions_defaults():
    w = torch.nn.Parameter(torch.randn(6, 4))
    optimizer = muon_cpp.Dion([w], rank_fraction=0.5)
    group = optimizer.param_groups[0]
    assert (group["lr"], group["momentum"], group["weight_decay"]) == (0.01, 0.95, 0.01)
    assert (group["adjust_lr"], group["rank_fraction"], group["rank_multiple_of"],
            group["epsilon"]) == ("spectral", 0.5, 1, 1e-8)
    assert "nesterov" not in group and "ns_steps" not in group  # Muon's, not Dion's
    # mu is microsoft/dion's keyword for momentum; the others are Dion's options by name, and
    # Muon's where they say what Dion does (as when Dion was a Muon setting, which took them).
    twin = torch.nn.Parameter(w.detach().clone())
    same = muon_cpp.Dion([twin], 0.01, 0.95, 0.01, rank_fraction=0.5, adjust_lr="spectral",
                         nesterov=False, momentum_form="sum", ns_steps=5,
                         state_dtype=torch.float32)
    assert "nesterov" not in same.param_groups[0]
    for p in (w, twin):
        p.grad = torch.ones_like(p)
    optimizer.step()
    same.step()
    assert torch.equal(w.detach(), twin.detach())


def earlier_state_dict(state_dict):
    """``state_dict`` as muon_cpp.Dion wrote it when Dion was a Muon setting: each group Muon's
    keys (at the values Dion ran with) with the rank settings in a ``dion`` dict."""
    old = {"state": state_dict["state"], "param_groups": []}
    for group in state_dict["param_groups"]:
        group = dict(group)
        rank = {key: group.pop(key) for key in ("rank_fraction", "rank_multiple_of", "epsilon")}
        group.update(nesterov=False, momentum_form="sum", ns_steps=5, coefficients="quintic",
                     normuon=None, state_dtype=torch.float32, dion=rank)
        old["param_groups"].append(group)
    return old


def test_state_dicts_of_earlier_versions_load():
    torch.manual_seed(7)
    start = torch.randn(8, 6)
    grads = [g.float() for g in gradients((8, 6), 4, seed=8)]
    straight = torch.nn.Parameter(start.clone())
    optimizer = muon_cpp.Dion([straight], lr=0.02, rank_fraction=0.5)
    for grad in grads:
        straight.grad = grad
        optimizer.step()
    resumed = torch.nn.Parameter(start.clone())
    first = muon_cpp.Dion([resumed], lr=0.02, rank_fraction=0.5)
    for grad in grads[:2]:
        resumed.grad = grad
        first.step()
    second = muon_cpp.Dion([resumed])  # the rates and rank come from the state dict
    second.load_state_dict(earlier_state_dict(first.state_dict()))
    group = second.param_groups[0]
    assert (group["lr"], group["rank_fraction"]) == (0.02, 0.5)
    assert "dion" not in group and "nesterov" not in group
    for grad in grads[2:]:
        resumed.grad = grad
        second.step()
    assert torch.equal(resumed.detach(), straight.detach())


def test_dion_state_dicts_resume_exactly():
    torch.manual_seed(5)
    start = torch.randn(8, 6)
    grads = [g.float() for g in gradients((8, 6), 4, seed=6)]
    straight = torch.nn.Parameter(start.clone())
    optimizer = muon_cpp.Dion([straight], rank_fraction=0.5)
    for grad in grads:
        straight.grad = grad
        optimizer.step()
    resumed = torch.nn.Parameter(start.clone())
    first = muon_cpp.Dion([resumed], rank_fraction=0.5)
    for grad in grads[:2]:
        resumed.grad = grad
        first.step()
    saved = io.BytesIO()
    torch.save(first.state_dict(), saved)
    saved.seek(0)
    second = muon_cpp.Dion([resumed], rank_fraction=0.5)
    second.load_state_dict(torch.load(saved))
    for grad in grads[2:]:
        resumed.grad = grad
        second.step()
    assert torch.equal(resumed.detach(), straight.detach())


def test_a_state_dict_that_ran_dion_names_muon_cpp_dion():
    """A state dict of muon_cpp.Muon(preset="dion") of earlier versions loads into muon_cpp.Dion
    (test_state_dicts_of_earlier_versions_load), and into Muon it is refused saying so."""
    w = torch.nn.Parameter(torch.randn(6, 4))
    dion = muon_cpp.Dion([w], rank_fraction=0.5)
    w.grad = torch.ones_like(w)
    dion.step()
    muon = muon_cpp.Muon([w])
    before = muon.state_dict()
    with pytest.raises(ValueError, match=r"this state dict ran Dion \(its groups hold the Muon "
                                         r"setting 'dion' of earlier versions\): load it into "
                                         r"muon_cpp.Dion"):
        muon.load_state_dict(earlier_state_dict(dion.state_dict()))
    assert muon.state_dict()["param_groups"] == before["param_groups"]


def test_dion_settings_are_checked():
    w = torch.nn.Parameter(torch.randn(6, 4))
    with pytest.raises(ValueError, match=r"Dion: rank_fraction must be in \(0, 1\], got 1.5"):
        muon_cpp.Dion([w], rank_fraction=1.5)
    with pytest.raises(ValueError, match="Dion: rank_multiple_of must be > 0, got 0"):
        muon_cpp.Dion([w], rank_multiple_of=0)
    with pytest.raises(ValueError, match=r"Dion: ns_steps=7 would do nothing: ns_steps is "
                                         r"Muon's setting, not Dion's; only 5, which says"):
        muon_cpp.Dion([w], ns_steps=7)
    with pytest.raises(ValueError, match="Dion: nesterov=True would do nothing"):
        muon_cpp.Dion([w], nesterov=True)
    with pytest.raises(TypeError, match="dion"):  # Dion is no longer a Muon setting
        muon_cpp.Muon([w], dion={})
    with pytest.raises(ValueError, match=r"preset must be None .* or one of 'torch', 'nanochat', "
                                         r"got 'dion' \(the preset 'dion' is muon_cpp.Dion's "
                                         r"defaults\)"):
        muon_cpp.Muon([w], preset="dion")
