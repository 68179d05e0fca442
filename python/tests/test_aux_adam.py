"""muon_cpp.MuonWithAuxAdam and SingleDeviceMuonWithAuxAdam against KellerJordan/Muon's muon.py
(github.com/KellerJordan/Muon), transcribed below: its group keys and defaults, its update (Adam
groups to float64 round-off; Muon groups to the difference between float32 and its bfloat16
Newton–Schulz), its state dicts in both directions, and the errors that replace its asserts."""
import math

import pytest
import torch
from torch import nn

import muon_cpp
import muon_cpp.optim


# ---- KellerJordan/Muon's muon.py, transcribed (one process: no torch.distributed) ----

def kj_newton_schulz(G, steps, dtype):
    """zeropower_via_newtonschulz5 in ``dtype`` (KellerJordan's: bfloat16)."""
    a, b, c = (3.4445, -4.7750, 2.0315)
    X = G.to(dtype)
    if G.size(-2) > G.size(-1):
        X = X.mT
    X = X / (X.norm(dim=(-2, -1), keepdim=True) + 1e-7)
    for _ in range(steps):
        A = X @ X.mT
        B = b * A + c * A @ A
        X = a * X + B @ X
    if G.size(-2) > G.size(-1):
        X = X.mT
    return X


def kj_muon_update(grad, momentum, beta, dtype, ns_steps=5, nesterov=True):
    momentum.lerp_(grad, 1 - beta)
    update = grad.lerp_(momentum, beta) if nesterov else momentum
    if update.ndim == 4:  # conv filters as (out, in·kh·kw)
        update = update.view(len(update), -1)
    update = kj_newton_schulz(update, ns_steps, dtype).to(grad.dtype)
    update *= max(1, grad.size(-2) / grad.size(-1)) ** 0.5
    return update


def kj_adam_update(grad, buf1, buf2, step, betas, eps):
    buf1.lerp_(grad, 1 - betas[0])
    buf2.lerp_(grad.square(), 1 - betas[1])
    buf1c = buf1 / (1 - betas[0] ** step)
    buf2c = buf2 / (1 - betas[1] ** step)
    return buf1c / (buf2c.sqrt() + eps)


class KJSingleDeviceMuonWithAuxAdam(torch.optim.Optimizer):
    """KellerJordan/Muon's SingleDeviceMuonWithAuxAdam; ``ns_dtype`` is the Newton–Schulz dtype
    (bfloat16 in muon.py), ``sort`` MuonWithAuxAdam's ordering of a Muon group's matrices."""

    def __init__(self, param_groups, ns_dtype=torch.bfloat16, sort=False):
        for group in param_groups:
            assert "use_muon" in group
            if group["use_muon"]:
                if sort:
                    group["params"] = sorted(group["params"], key=lambda x: x.size(),
                                             reverse=True)
                group["lr"] = group.get("lr", 0.02)
                group["momentum"] = group.get("momentum", 0.95)
                group["weight_decay"] = group.get("weight_decay", 0)
                assert set(group.keys()) == {"params", "lr", "momentum", "weight_decay",
                                             "use_muon"}
            else:
                group["lr"] = group.get("lr", 3e-4)
                group["betas"] = group.get("betas", (0.9, 0.95))
                group["eps"] = group.get("eps", 1e-10)
                group["weight_decay"] = group.get("weight_decay", 0)
                assert set(group.keys()) == {"params", "lr", "betas", "eps", "weight_decay",
                                             "use_muon"}
        self.ns_dtype = ns_dtype
        super().__init__(param_groups, dict())

    @torch.no_grad()
    def step(self):
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is None:
                    p.grad = torch.zeros_like(p)
                state = self.state[p]
                if group["use_muon"]:
                    if len(state) == 0:
                        state["momentum_buffer"] = torch.zeros_like(p)
                    update = kj_muon_update(p.grad.clone(), state["momentum_buffer"],
                                            group["momentum"], self.ns_dtype)
                    p.mul_(1 - group["lr"] * group["weight_decay"])
                    p.add_(update.reshape(p.shape), alpha=-group["lr"])
                else:
                    if len(state) == 0:
                        state["exp_avg"] = torch.zeros_like(p)
                        state["exp_avg_sq"] = torch.zeros_like(p)
                        state["step"] = 0
                    state["step"] += 1
                    update = kj_adam_update(p.grad, state["exp_avg"], state["exp_avg_sq"],
                                            state["step"], group["betas"], group["eps"])
                    p.mul_(1 - group["lr"] * group["weight_decay"])
                    p.add_(update, alpha=-group["lr"])


# ---- a model as KellerJordan/Muon's README splits one ----

class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(11, 8)
        self.conv = nn.Conv2d(2, 4, 3, padding=1)  # a 4-D kernel: Muon as (4, 18)
        self.blocks = nn.ModuleList(nn.Linear(8, 8) for _ in range(2))
        self.wide = nn.Linear(8, 16)
        self.narrow = nn.Linear(16, 8)
        self.head = nn.Linear(8, 11, bias=False)

    def forward(self, tokens):
        x = self.embed(tokens)  # (batch, 8, 8)
        x = x + self.conv(torch.stack([x, x.flip(-1)], 1)).mean(1)
        for block in self.blocks:
            x = x + torch.tanh(block(x))
        return self.head(self.narrow(torch.relu(self.wide(x))))


def model(dtype=torch.float64, seed=0):
    torch.manual_seed(seed)
    return Model().to(dtype)


def groups(m, **adam):
    hidden = [p for n, p in m.named_parameters() if p.ndim >= 2 and "embed" not in n
              and "head" not in n]
    rest = [p for n, p in m.named_parameters() if p.ndim < 2 or "embed" in n or "head" in n]
    return [dict(params=hidden, use_muon=True, lr=0.03, momentum=0.9, weight_decay=0.01),
            dict(params=rest, use_muon=False, **adam)]


def train(m, optimizer, steps, first=0):
    for step in range(first, first + steps):
        generator = torch.Generator().manual_seed(step)
        tokens = torch.randint(0, 11, (3, 8), generator=generator)
        optimizer.zero_grad()
        logits = m(tokens)
        nn.functional.cross_entropy(logits.reshape(-1, 11).float(), tokens.reshape(-1)).backward()
        optimizer.step()


def largest_relative_difference(a, b):
    return max(((p - q).abs().max() / q.abs().max()).item()
               for p, q in zip(a.parameters(), b.parameters()))


@pytest.mark.parametrize("cls, sort", [(muon_cpp.MuonWithAuxAdam, True),
                                       (muon_cpp.SingleDeviceMuonWithAuxAdam, False)])
def test_groups_hold_keller_jordans_keys_defaults_and_order(cls, sort):
    ours_model, theirs_model = model(), model()
    ours = cls([dict(params=g["params"], use_muon=g["use_muon"]) for g in groups(ours_model)])
    theirs = KJSingleDeviceMuonWithAuxAdam(
        [dict(params=g["params"], use_muon=g["use_muon"]) for g in groups(theirs_model)],
        sort=sort)
    names = {id(p): n for n, p in ours_model.named_parameters()}
    their_names = {id(p): n for n, p in theirs_model.named_parameters()}
    for mine, kj in zip(ours.param_groups, theirs.param_groups):
        assert {k: v for k, v in mine.items() if k != "params"} == \
            {k: v for k, v in kj.items() if k != "params"}
        assert [names[id(p)] for p in mine["params"]] == [their_names[id(p)] for p in kj["params"]]
    assert ours.param_groups[0]["lr"] == 0.02 and ours.param_groups[1]["eps"] == 1e-10
    if sort:  # largest first: the conv kernel (4, 2, 3, 3) before the (16, 8) and (8, 16) ones
        assert [tuple(p.shape) for p in ours.param_groups[0]["params"]][:3] == \
            [(16, 8), (8, 16), (8, 8)]


@pytest.mark.parametrize("cls", [muon_cpp.MuonWithAuxAdam, muon_cpp.SingleDeviceMuonWithAuxAdam])
def test_steps_equal_keller_jordans_in_float64(cls):
    """float64 parameters: muon-cpp runs Newton–Schulz and Adam in float64, the transcription too
    (its bfloat16 Newton–Schulz replaced by float64): equal to round-off over 6 steps."""
    ours_model, theirs_model = model(), model()
    ours = cls(groups(ours_model, lr=3e-3, betas=(0.8, 0.95)))
    theirs = KJSingleDeviceMuonWithAuxAdam(groups(theirs_model, lr=3e-3, betas=(0.8, 0.95)),
                                           ns_dtype=torch.float64)
    train(ours_model, ours, 6)
    train(theirs_model, theirs, 6)
    assert largest_relative_difference(ours_model, theirs_model) < 1e-12
    # Adam's moments and the momentum buffers are KellerJordan's state, under its names.
    for p, q in zip(ours_model.parameters(), theirs_model.parameters()):
        for key, value in theirs.state[q].items():
            mine = ours.state[p][key]
            assert torch.allclose(mine.double(), torch.as_tensor(value).double(), rtol=1e-10,
                                  atol=1e-14), key


def test_muon_groups_are_within_float32_of_keller_jordans_bfloat16():
    """float32 parameters: muon-cpp orthogonalizes in float32, KellerJordan/Muon in bfloat16.
    Against the transcription in float32 the steps agree to float32 round-off; against its
    bfloat16 original they differ by no more than float32 and bfloat16 differ from each other."""
    ours_model, fp32_model, bf16_model = (model(torch.float32) for _ in range(3))
    ours = muon_cpp.SingleDeviceMuonWithAuxAdam(groups(ours_model))
    fp32 = KJSingleDeviceMuonWithAuxAdam(groups(fp32_model), ns_dtype=torch.float32)
    bf16 = KJSingleDeviceMuonWithAuxAdam(groups(bf16_model), ns_dtype=torch.bfloat16)
    for m, o in ((ours_model, ours), (fp32_model, fp32), (bf16_model, bf16)):
        train(m, o, 3)
    assert largest_relative_difference(ours_model, fp32_model) < 1e-4
    bf16_gap = largest_relative_difference(fp32_model, bf16_model)
    assert 1e-4 < bf16_gap  # bfloat16's own difference is the larger one
    assert largest_relative_difference(ours_model, bf16_model) < 1.5 * bf16_gap


def test_state_dicts_move_between_keller_jordans_class_and_ours_mid_run():
    reference_model, kj_model, ours_model = model(), model(), model()
    reference = KJSingleDeviceMuonWithAuxAdam(groups(reference_model), ns_dtype=torch.float64)
    kj = KJSingleDeviceMuonWithAuxAdam(groups(kj_model), ns_dtype=torch.float64)
    train(reference_model, reference, 6)
    train(kj_model, kj, 2)
    ours = muon_cpp.SingleDeviceMuonWithAuxAdam(groups(ours_model))
    ours_model.load_state_dict(kj_model.state_dict())
    ours.load_state_dict(kj.state_dict())  # theirs into ours: 'step' an int, Muon's absent
    train(ours_model, ours, 2, first=2)
    back = KJSingleDeviceMuonWithAuxAdam(groups(kj_model), ns_dtype=torch.float64)
    kj_model.load_state_dict(ours_model.state_dict())
    back.load_state_dict(ours.state_dict())  # ours into theirs
    train(kj_model, back, 2, first=4)
    assert largest_relative_difference(kj_model, reference_model) < 1e-12


def test_groups_keller_jordans_class_refuses_are_errors_naming_the_key():
    m = model()
    hidden, rest = groups(m)[0]["params"], groups(m)[1]["params"]
    with pytest.raises(ValueError, match="every param group needs use_muon .* a group has only "
                                         "'params', 'lr'"):
        muon_cpp.MuonWithAuxAdam([dict(params=hidden, lr=0.02)])
    with pytest.raises(TypeError, match="use_muon must be True or False, got int"):
        muon_cpp.MuonWithAuxAdam([dict(params=hidden, use_muon=1)])
    with pytest.raises(ValueError, match="a param group has 'betas', an option of AdamW, Adam, "
                                         "Lamb, Lion but not of Muon"):
        muon_cpp.MuonWithAuxAdam([dict(params=hidden, use_muon=True, betas=(0.9, 0.95))])
    with pytest.raises(ValueError, match="a param group has 'momentum', an option of Muon, Dion "
                                         "but not of AdamW"):
        muon_cpp.SingleDeviceMuonWithAuxAdam([dict(params=rest, use_muon=False, momentum=0.9)])
    with pytest.raises(ValueError, match="parameter 0 of param group 0 has shape \\[11\\]"):
        muon_cpp.SingleDeviceMuonWithAuxAdam([dict(params=[torch.zeros(11, requires_grad=True)],
                                                    use_muon=True)])
    # muon-cpp's own options of a group's algorithm are taken (KellerJordan's class asserts).
    optimizer = muon_cpp.MuonWithAuxAdam([dict(params=hidden, use_muon=True, ns_steps=6),
                                          dict(params=rest, use_muon=False, nesterov=True)])
    assert optimizer.param_groups[0]["ns_steps"] == 6


def test_other_classes_refuse_keller_jordans_groups_naming_the_key():
    m = model()
    kj_groups = groups(m, lr=3e-4, betas=(0.8, 0.95), eps=1e-10)
    for cls in (muon_cpp.Muon, muon_cpp.optim.Muon, muon_cpp.Dion, muon_cpp.AdamW, muon_cpp.Lion):
        with pytest.raises(ValueError, match=f"{cls.__name__}: a param group has use_muon=True, "
                                             "KellerJordan/Muon's key .* Use "
                                             "muon_cpp.MuonWithAuxAdam"):
            cls([dict(g) for g in kj_groups])
    # Without use_muon, Adam's keys in a Muon group are still another algorithm's.
    adam_group = {k: v for k, v in kj_groups[1].items() if k != "use_muon"}
    adam_group["params"] = [m.head.weight]
    with pytest.raises(ValueError, match="Muon: a param group has 'betas', an option of AdamW"):
        muon_cpp.Muon([adam_group])
    # ... also when written into param_groups between steps: refused at the step, nothing moves.
    optimizer = muon_cpp.Muon([m.head.weight])
    optimizer.param_groups[0]["use_muon"] = False
    m.head.weight.grad = torch.ones_like(m.head.weight)
    before = m.head.weight.detach().clone()
    with pytest.raises(ValueError, match="use_muon=False"):
        optimizer.step()
    assert torch.equal(m.head.weight.detach(), before)
    # Keys no algorithm reads are kept, as torch keeps them.
    optimizer.param_groups[0].pop("use_muon")
    optimizer.param_groups[0]["initial_lr"] = 0.02
    optimizer.param_groups[0]["my_note"] = "kept"
    optimizer.step()
    assert optimizer.param_groups[0]["my_note"] == "kept"


def test_a_process_group_of_one_rank_changes_nothing(tmp_path):
    import torch.distributed as dist
    dist.init_process_group("gloo", init_method="file://" + str(tmp_path / "rendezvous"),
                            rank=0, world_size=1)
    try:
        alone_model, grouped_model = model(), model()
        alone = muon_cpp.MuonWithAuxAdam(groups(alone_model))
        grouped = muon_cpp.MuonWithAuxAdam(groups(grouped_model),
                                           process_group=dist.group.WORLD)
        train(alone_model, alone, 3)
        train(grouped_model, grouped, 3)
        assert largest_relative_difference(alone_model, grouped_model) == 0
    finally:
        dist.destroy_process_group()
