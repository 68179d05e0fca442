"""torch.optim's contract, held over every optimizer of muon_cpp by one suite — as PyTorch runs its
OptimizerInfo tests over torch.optim and optax its _common_test over its optimizers.

The cases come from the algorithm registry (muon/algorithms.h, ``_core.algorithms()``): each
registered algorithm's class, found by its ``_algorithm``, plus the optimizers that run several
(the hybrid, built from a model and from plain param groups; KellerJordan/Muon's two classes),
NAdam and the torch.optim.Muon drop-in. An algorithm added to the registry joins the suite without
an edit here; one without a class fails test_every_registered_algorithm_is_in_the_suite.

The contract: state-dict and step hooks, a mid-run state_dict round trip equal to staying, tensors
swapped into, appended to and removed from param_groups, zero_grad, closures, torch's schedulers,
copy.deepcopy and pickle, tensor learning rates, parameters without gradients, bfloat16 parameters,
and errors that name what is wrong and change nothing."""
import copy
import io
import pickle
from dataclasses import dataclass
from typing import Callable

import pytest
import torch
from torch import nn
from torch.optim import Optimizer, lr_scheduler

import muon_cpp
import muon_cpp.optim
from muon_cpp import _core


class Net(nn.Module):
    """Three matrices, biases and a norm: something for every algorithm."""

    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(6, 8)
        self.norm = nn.LayerNorm(8)
        self.fc2 = nn.Linear(8, 8)
        self.head = nn.Linear(8, 3)

    def forward(self, x):
        return self.head(torch.relu(self.fc2(self.norm(torch.relu(self.fc1(x))))))


def net(seed=0, dtype=torch.float32):
    torch.manual_seed(seed)
    return Net().to(dtype)


def loss(model, step):
    generator = torch.Generator().manual_seed(100 + step)
    x = torch.randn(5, 6, generator=generator).to(next(model.parameters()).dtype)
    return (model(x).float() - 0.5).square().mean()


def backward(model, step):
    for p in model.parameters():
        p.grad = None
    loss(model, step).backward()


def matrices(model):
    return [model.fc1.weight, model.fc2.weight, model.head.weight]


def others(model):
    return [model.fc1.bias, model.norm.weight, model.norm.bias, model.fc2.bias, model.head.bias]


@dataclass
class Case:
    name: str
    algorithms: tuple  # the registry's algorithms it runs
    make: Callable  # model -> optimizer
    cycles_momentum: bool = True  # OneCycleLR(cycle_momentum=True) can drive it
    matrices_only: bool = False  # every group takes matrices alone

    def __repr__(self):
        return self.name


def single(cls, algorithm, matrices_only, **options):
    """Two groups of one algorithm's class: the second with its own lr."""
    def make(model):
        params = matrices(model) if matrices_only else matrices(model) + others(model)
        lr = cls(params[:1], **options).param_groups[0]["lr"]  # the class's default
        return cls([{"params": params[:-2]}, {"params": params[-2:], "lr": lr / 2}], **options)
    return make


def registered_classes():
    """{registry name: the muon_cpp class that runs it on every group}."""
    return {cls._algorithm: cls for cls in vars(muon_cpp).values()
            if isinstance(cls, type) and issubclass(cls, Optimizer)
            and getattr(cls, "_algorithm", None)}


def cases():
    out = []
    classes = registered_classes()
    for algorithm, matrices_only in _core.algorithms():
        if algorithm in classes:
            # OneCycleLR cycles a group's momentum or betas; an algorithm with neither it refuses.
            momentum = {n for n, *_ in _core.option_schema(algorithm)} & {"momentum", "betas"}
            out.append(Case(classes[algorithm].__name__, (algorithm,),
                            single(classes[algorithm], algorithm, matrices_only),
                            cycles_momentum=bool(momentum), matrices_only=matrices_only))
    out.append(Case("NAdam", ("adamw",), single(muon_cpp.AdamW, "adamw", False, nesterov=True)))
    out.append(Case("optim.Muon", ("muon",), single(muon_cpp.optim.Muon, "muon", True),
                    matrices_only=True))
    out.append(Case("HybridOptimizer", ("muon", "adamw"),
                    lambda model: muon_cpp.HybridOptimizer(model, {"optimizer": {"lr": 0.02}}),
                    cycles_momentum=False))
    out.append(Case("HybridOptimizer(groups)", ("muon", "adamw"),
                    lambda model: muon_cpp.HybridOptimizer(
                        [{"params": matrices(model) + others(model)[:2], "weight_decay": 0.1},
                         {"params": others(model)[2:], "weight_decay": 0.0}],
                        lr=0.02, adamw_lr=3e-3), cycles_momentum=False))
    for cls in (muon_cpp.MuonWithAuxAdam, muon_cpp.SingleDeviceMuonWithAuxAdam):
        out.append(Case(cls.__name__, ("muon", "adamw"),
                        lambda model, cls=cls: cls(
                            [dict(params=matrices(model), use_muon=True),
                             dict(params=others(model), use_muon=False, lr=3e-3)]),
                        cycles_momentum=False))
    return out


CASES = cases()


def test_every_registered_algorithm_is_in_the_suite():
    covered = {algorithm for case in CASES for algorithm in case.algorithms}
    registered = [name for name, _ in _core.algorithms()]
    missing = [name for name in registered if name not in registered_classes()]
    assert not missing, (f"registered algorithms without a muon_cpp class (a subclass of "
                         f"_EngineOptimizer whose _algorithm names it): {missing}")
    assert set(registered) <= covered
    assert len(registered) >= 6  # muon, dion, adamw, adam, lamb, lion at least


def params_of(optimizer):
    return [p for group in optimizer.param_groups for p in group["params"]]


def run(model, optimizer, steps, first=0, scheduler=None):
    for step in range(first, first + steps):
        backward(model, step)
        optimizer.step()
        if scheduler is not None:
            scheduler.step()


def same(model_a, model_b):
    return all(torch.equal(a, b) for a, b in zip(model_a.parameters(), model_b.parameters()))


@pytest.fixture(params=CASES, ids=repr)
def case(request):
    return request.param


# ---- hooks ----

def test_state_dict_hooks_run_in_torchs_order_with_torchs_arguments(case):
    model = net()
    optimizer = case.make(model)
    run(model, optimizer, 1)
    calls = []
    optimizer.register_state_dict_pre_hook(lambda o: calls.append(("pre", o)))
    optimizer.register_state_dict_pre_hook(lambda o: calls.append(("first", o)), prepend=True)

    def post(o, state_dict):
        calls.append(("post", o, state_dict))
        return dict(state_dict, written_by="post hook")
    handle = optimizer.register_state_dict_post_hook(post)
    state_dict = optimizer.state_dict()
    assert [c[0] for c in calls] == ["first", "pre", "post"]
    assert all(c[1] is optimizer for c in calls)
    assert state_dict["written_by"] == "post hook" and "written_by" not in calls[2][2]
    handle.remove()
    assert "written_by" not in optimizer.state_dict()

    calls.clear()
    given = dict(state_dict)

    def load_pre(o, loaded):
        calls.append(("load pre", o, loaded))
        loaded = copy.deepcopy(loaded)
        loaded["param_groups"][0]["lr"] = 0.125
        return loaded
    optimizer.register_load_state_dict_pre_hook(load_pre)
    optimizer.register_load_state_dict_post_hook(
        lambda o: calls.append(("load post", o, o.param_groups[0]["lr"])))
    optimizer.load_state_dict(given)
    assert [c[0] for c in calls] == ["load pre", "load post"]
    assert calls[0][1] is optimizer and calls[1][1] is optimizer
    assert calls[0][2] == given and calls[0][2] is not given  # a shallow copy, as torch passes
    assert calls[1][2] == 0.125 == optimizer.param_groups[0]["lr"]  # post: after the load


def test_step_hooks_run_around_each_step(case):
    model = net()
    optimizer = case.make(model)
    if not hasattr(Optimizer, "register_step_pre_hook"):  # PyTorch 1.13: torch has none
        assert not hasattr(optimizer, "register_step_pre_hook")
        return
    calls = []
    optimizer.register_step_pre_hook(lambda o, args, kwargs: calls.append(("pre", o)))
    optimizer.register_step_post_hook(lambda o, args, kwargs: calls.append(("post", o)))
    run(model, optimizer, 2)
    assert calls == [("pre", optimizer), ("post", optimizer)] * 2


# ---- state dicts ----

def test_state_dict_mid_run_round_trip_equals_staying(case):
    model = net()
    optimizer = case.make(model)
    run(model, optimizer, 3)
    buffer = io.BytesIO()
    torch.save(optimizer.state_dict(), buffer)
    buffer.seek(0)
    resumed_model = copy.deepcopy(model)
    resumed = case.make(resumed_model)
    resumed.load_state_dict(torch.load(buffer))
    run(model, optimizer, 3, first=3)
    run(resumed_model, resumed, 3, first=3)
    assert same(model, resumed_model)


# ---- param_groups read at every step ----

def fresh_like(p, shift=0.25):
    return nn.Parameter(p.detach().clone() + shift)


def test_a_swapped_tensor_is_stepped_from_fresh_state_and_the_old_one_forgotten(case):
    model, reference = net(), net()
    optimizer, untouched = case.make(model), case.make(reference)
    run(model, optimizer, 2)
    run(reference, untouched, 2)
    old = optimizer.param_groups[0]["params"][0]
    new = fresh_like(old)
    name = next(n for n, p in model.named_parameters() if p is old)
    at_swap = copy.deepcopy(model)
    # The new tensor stands where the old one was: the model computes with it.
    module, attribute = name.rsplit(".", 1)
    setattr(model.get_submodule(module), attribute, new)
    optimizer.param_groups[0]["params"][0] = new
    old_before = old.detach().clone()
    backward(model, 2)
    old.grad = torch.ones_like(old)  # a gradient it would use, were it still stepped
    optimizer.step()
    assert torch.equal(old.detach(), old_before)
    assert not torch.equal(new.detach(), fresh_like(old_before).detach())
    assert float(optimizer.state[new]["step"]) == 1
    assert old not in dict(optimizer.state)
    numbered = {id(p): i for i, p in enumerate(params_of(optimizer))}
    assert set(optimizer.state_dict()["state"]) == {numbered[id(p)] for p in optimizer.state}
    # Its first update is a fresh optimizer's first update of it.
    setattr(at_swap.get_submodule(module), attribute, fresh_like(old_before))
    first = case.make(at_swap)
    backward(at_swap, 2)
    first.step()
    assert torch.equal(new.detach(), dict(at_swap.named_parameters())[name].detach())
    # The others go on, from the same gradients, as if nothing had happened.
    for (n, p), q in zip(model.named_parameters(), reference.parameters()):
        q.grad = None if p.grad is None else p.grad.clone()
    untouched.step()
    for (n, p), q in zip(model.named_parameters(), reference.parameters()):
        if n != name and any(p is r for r in params_of(optimizer)):
            assert torch.equal(p, q), n


def test_an_appended_tensor_is_stepped_and_a_removed_one_left_alone(case):
    model = net()
    optimizer = case.make(model)
    run(model, optimizer, 1)
    group = optimizer.param_groups[0]
    removed = group["params"].pop()
    appended = nn.Parameter(torch.randn(4, 6))
    group["params"].append(appended)
    removed_before, appended_before = removed.detach().clone(), appended.detach().clone()
    backward(model, 1)
    appended.grad = torch.randn(4, 6)
    optimizer.step()
    assert torch.equal(removed.detach(), removed_before) and removed not in dict(optimizer.state)
    assert not torch.equal(appended.detach(), appended_before)
    assert float(optimizer.state[appended]["step"]) == 1
    state_dict = optimizer.state_dict()
    assert next(i for i, p in enumerate(params_of(optimizer)) if p is appended) in \
        state_dict["state"]
    assert len(state_dict["state"]) == len(optimizer.state) == sum(
        1 for p in params_of(optimizer) if p.grad is not None)


def test_a_tensor_the_group_cannot_take_is_refused_at_the_next_step_and_nothing_moves(case):
    model = net()
    optimizer = case.make(model)
    run(model, optimizer, 1)
    group = optimizer.param_groups[0]
    kept = group["params"][0]
    before = [p.detach().clone() for p in params_of(optimizer)]
    state_before = {k: v.clone() for k, v in optimizer.state[kept].items()}
    fused = group.get("fused")
    meta = nn.Parameter(torch.zeros(8, 6, device="meta"))
    meta.grad = torch.zeros(8, 6, device="meta")
    wrong = [(torch.zeros(3, 2, dtype=torch.int64), fused),  # another dtype
             (meta, True)]  # another device than fused kernels take
    if case.matrices_only or case.name.startswith(("Hybrid", "Muon", "SingleDevice")):
        wrong.append((nn.Parameter(torch.zeros(5)), fused))  # a vector in a matrices group
    for tensor, fused_now in wrong:
        group["params"][0] = tensor
        group["fused"] = fused_now
        backward(model, 1)
        with pytest.raises(RuntimeError, match="param_groups changed since the optimizer last "
                                               "read them.*parameter 0 of param group 0"):
            optimizer.step()
        assert all(torch.equal(p, b) for p, b in zip(params_of(optimizer)[1:], before[1:]))
    group["params"][0] = kept  # put back: the run goes on with its state
    group["fused"] = fused
    assert all(torch.equal(v, state_before[k]) for k, v in optimizer.state[kept].items())
    optimizer.step()
    assert float(optimizer.state[kept]["step"]) == 2


# ---- torch.optim's other methods ----

def test_add_param_group_adds_a_group_stepped_from_the_next_step(case):
    model = net()
    optimizer = case.make(model)
    run(model, optimizer, 1)
    extra = nn.Parameter(torch.randn(4, 6))
    group = {"params": [extra], "lr": 0.01}
    if "MuonWithAuxAdam" in case.name:
        group["use_muon"] = True
    if case.name.startswith("Hybrid"):  # its groups are its configuration's
        with pytest.raises(ValueError, match="HybridOptimizer's parameter groups come from its "
                                             "configuration"):
            optimizer.add_param_group(group)
        return
    optimizer.add_param_group(group)
    added = optimizer.param_groups[-1]
    assert added["lr"] == 0.01 and set(optimizer.param_groups[0]) <= set(added)  # defaults in
    before = extra.detach().clone()
    backward(model, 1)
    extra.grad = torch.randn(4, 6)
    optimizer.step()
    assert not torch.equal(extra.detach(), before) and float(optimizer.state[extra]["step"]) == 1
    with pytest.raises(ValueError, match="some parameters appear in more than one parameter group|"
                                         "is also parameter 0 of param group"):
        optimizer.add_param_group({"params": [extra], **({"use_muon": True} if "use_muon" in
                                                         group else {})})


def test_zero_grad_sets_none_or_zeros_as_torch_does(case):
    model = net()
    optimizer = case.make(model)
    backward(model, 0)
    optimizer.zero_grad(set_to_none=False)
    assert all(p.grad is not None and not p.grad.any() for p in params_of(optimizer))
    optimizer.zero_grad(set_to_none=True)
    assert all(p.grad is None for p in params_of(optimizer))
    backward(model, 0)
    reference = torch.optim.SGD(params_of(optimizer), lr=0.1)
    optimizer.zero_grad()  # torch's default: zeros up to 1.13, None from 2.0 on
    after_ours = [p.grad for p in params_of(optimizer)]
    backward(model, 0)
    reference.zero_grad()
    assert [g is None for g in after_ours] == [p.grad is None for p in params_of(optimizer)]


def test_a_closure_runs_once_with_gradients_and_its_loss_is_returned(case):
    model, twin = net(), net()
    optimizer, twin_optimizer = case.make(model), case.make(twin)
    calls = []

    def closure():
        calls.append(torch.is_grad_enabled())
        optimizer.zero_grad()
        value = loss(model, 0)
        value.backward()
        return value
    with torch.no_grad():
        returned = optimizer.step(closure)
    assert calls == [True] and torch.equal(returned, loss(twin, 0))
    run(twin, twin_optimizer, 1)
    assert same(model, twin)


SCHEDULERS = {
    "ReduceLROnPlateau": lambda o: lr_scheduler.ReduceLROnPlateau(o, factor=0.5, patience=0),
    "SequentialLR": lambda o: lr_scheduler.SequentialLR(
        o, [lr_scheduler.LinearLR(o, start_factor=0.25, total_iters=2),
            lr_scheduler.ExponentialLR(o, gamma=0.5)], milestones=[2]),
    "SWALR": lambda o: torch.optim.swa_utils.SWALR(o, swa_lr=0.004, anneal_epochs=2),
    "OneCycleLR": lambda o: lr_scheduler.OneCycleLR(o, max_lr=0.01, total_steps=10,
                                                    cycle_momentum=True),
}
_DRIVEN = ("lr", "momentum", "betas")


@pytest.mark.parametrize("scheduler", SCHEDULERS)
def test_torch_schedulers_drive_every_group(case, scheduler):
    model, twin, fixed = net(), net(), net()
    optimizer, twin_optimizer, fixed_optimizer = case.make(model), case.make(twin), case.make(fixed)
    if scheduler == "OneCycleLR" and not case.cycles_momentum:
        # Its groups hold two momenta (Muon's momentum, Adam's betas); OneCycleLR drives one for
        # all groups, so torch refuses the optimizer, as it refuses KellerJordan/Muon's.
        with pytest.raises(ValueError, match="optimizer must support momentum"):
            SCHEDULERS[scheduler](optimizer)
        return
    driver = SCHEDULERS[scheduler](optimizer)
    for step in range(5):
        # The twin gets the same settings written by hand: the scheduler's values are used as
        # any written between steps are.
        for ours, theirs in zip(optimizer.param_groups, twin_optimizer.param_groups):
            theirs.update({key: ours[key] for key in _DRIVEN if key in ours})
        for m, o in ((model, optimizer), (twin, twin_optimizer), (fixed, fixed_optimizer)):
            backward(m, step)
            o.step()
        if scheduler == "ReduceLROnPlateau":
            driver.step(float(step))  # a loss that never improves: the rate halves each step
        else:
            driver.step()
    assert same(model, twin)
    assert not same(model, fixed)


# ---- copies ----

@pytest.mark.parametrize("how", ["deepcopy", "pickle"])
def test_copies_continue_as_the_original_and_apart_from_it(case, how):
    model = net()
    optimizer = case.make(model)
    run(model, optimizer, 2)
    if how == "deepcopy":
        model_copy, optimizer_copy = copy.deepcopy((model, optimizer))
    else:
        model_copy, optimizer_copy = pickle.loads(pickle.dumps((model, optimizer)))
    assert type(optimizer_copy) is type(optimizer)
    assert all(p is q for p, q in zip(params_of(optimizer_copy), [
        dict(model_copy.named_parameters())[n] for n in
        [next(n for n, q in model.named_parameters() if q is p) for p in params_of(optimizer)]]))
    kept = {k: v.clone() for k, v in optimizer.state[params_of(optimizer)[0]].items()}
    run(model_copy, optimizer_copy, 2, first=2)
    assert all(torch.equal(v, kept[k]) for k, v in optimizer.state[params_of(optimizer)[0]].items())
    run(model, optimizer, 2, first=2)
    assert same(model, model_copy)


# ---- values ----

def test_a_tensor_learning_rate_is_a_learning_rate(case):
    model, twin = net(), net()
    optimizer, twin_optimizer = case.make(model), case.make(twin)
    for group in optimizer.param_groups:  # float64: the same rate as the float
        group["lr"] = torch.tensor(group["lr"], dtype=torch.float64)
    run(model, optimizer, 2)
    run(twin, twin_optimizer, 2)
    assert same(model, twin)


def test_settings_cross_into_the_engine_when_they_change_and_only_then(case):
    """A step checks and pushes the groups' settings only when they differ from those the engine
    got (a tensor lr filled in place included); a twin that pushes at every step, as before,
    moves the same."""
    model, twin = net(), net()
    optimizer, twin_optimizer = case.make(model), case.make(twin)
    pushes = []
    checked = optimizer._from_torch_names
    optimizer._from_torch_names = lambda group: pushes.append(group) or checked(group)
    groups = len(optimizer.param_groups)

    def step(number):
        for m, o in ((model, optimizer), (twin, twin_optimizer)):
            backward(m, number)
            twin_optimizer._pushed = None  # the twin: everything pushed again
            o.step()
    step(0)
    assert len(pushes) == groups
    step(1)
    step(2)
    assert len(pushes) == groups  # nothing changed: nothing crossed
    for o in (optimizer, twin_optimizer):
        o.param_groups[0]["lr"] = torch.tensor(o.param_groups[0]["lr"] / 2)
    step(3)
    assert len(pushes) == 2 * groups
    for o in (optimizer, twin_optimizer):
        lr = o.param_groups[0]["lr"]  # the hybrid's step wrote its own rate back, a float
        if isinstance(lr, torch.Tensor):
            lr.mul_(0.5)  # in place: the same tensor, another rate
        else:
            o.param_groups[0]["lr"] = lr * 0.5
    step(4)
    assert len(pushes) == 3 * groups
    # A step that fails on a setting pushed it: the setting put back is pushed again.
    lr = optimizer.param_groups[0]["lr"]
    optimizer.param_groups[0]["lr"] = -1.0
    backward(model, 5)
    with pytest.raises((ValueError, RuntimeError), match="lr must be >= 0, got -1"):
        optimizer.step()
    optimizer.param_groups[0]["lr"] = lr
    twin_optimizer.param_groups[0]["lr"] = lr
    step(5)
    assert same(model, twin)


def test_parameters_without_gradients_are_left_alone(case):
    model = net()
    optimizer = case.make(model)
    idle = optimizer.param_groups[-1]["params"][-1]
    before = idle.detach().clone()
    for step in range(2):
        backward(model, step)
        idle.grad = None
        optimizer.step()
    assert torch.equal(idle.detach(), before)
    # No state: the hybrid makes all of it when built (zeros, step 0), the others at a first step.
    assert idle not in dict(optimizer.state) or float(optimizer.state[idle]["step"]) == 0


def test_bfloat16_parameters_step_as_float32_ones_rounded(case):
    """One step from the same values and gradients: each bf16 parameter within one bf16 unit in
    the last place of the float32 run's value (its rounding)."""
    model16 = net(dtype=torch.bfloat16)
    model32 = copy.deepcopy(model16).float()
    optimizer16, optimizer32 = case.make(model16), case.make(model32)
    backward(model16, 0)
    for p16, p32 in zip(model16.parameters(), model32.parameters()):
        p32.grad = p16.grad.float()
    optimizer16.step()
    optimizer32.step()
    for (name, p16), p32 in zip(model16.named_parameters(), model32.parameters()):
        ulp = torch.finfo(torch.bfloat16).eps * 2.0 ** torch.floor(torch.log2(p32.detach().abs()
                                                                                .clamp_min(1e-30)))
        assert p16.dtype == torch.bfloat16
        assert ((p16.float() - p32).abs() <= ulp).all(), name


def test_errors_name_the_setting_and_change_nothing(case):
    model = net()
    optimizer = case.make(model)
    run(model, optimizer, 1)
    before = [p.detach().clone() for p in params_of(optimizer)]
    group = optimizer.param_groups[-1]
    lr = group["lr"]
    backward(model, 1)
    group["lr"] = -1.0
    with pytest.raises((RuntimeError, ValueError), match="lr"):
        optimizer.step()
    group["lr"] = "fast"
    with pytest.raises(TypeError, match="lr must be a number, got str 'fast'"):
        optimizer.step()
    assert all(torch.equal(p, b) for p, b in zip(params_of(optimizer), before))
    group["lr"] = lr
    optimizer.step()
    assert not all(torch.equal(p, b) for p, b in zip(params_of(optimizer), before))
