"""Parity with the newest torch.optim.Muon: muon_cpp.optim.Muon (its exact signature), the Gram
Newton–Schulz keywords, named parameters on every optimizer, state dicts that move between
muon-cpp and torch.optim.Muon mid-run, and PyTorch's own frozen regression values."""
import copy
import inspect
import os
import subprocess
import sys

import pytest
import torch

import muon_cpp
from muon_cpp.optim import Muon as OptimMuon
import needs
from distributed_support import python_path
from helpers import DEFAULT_GRAM, QUINTIC, TranscribedMuon, max_rel_diff
TORCH_HAS_MUON = hasattr(torch.optim, "Muon")
TORCH_HAS_GRAM = TORCH_HAS_MUON and "use_gram_newton_schulz" in inspect.signature(
    torch.optim.Muon.__init__).parameters


def run(optimizer, params, grads):
    for step_grads in grads:
        for p, g in zip(params, step_grads):
            p.grad = g.clone()
        optimizer.step()


def random_grads(shapes, steps, seed, dtype=torch.float64):
    generator = torch.Generator().manual_seed(seed)
    return [[torch.randn(shape, generator=generator, dtype=dtype) for shape in shapes]
            for _ in range(steps)]


def parameters(shapes, seed=0, dtype=torch.float64):
    generator = torch.Generator().manual_seed(seed)
    return [torch.nn.Parameter(torch.randn(shape, generator=generator, dtype=dtype))
            for shape in shapes]


# ---- the drop-in: torch.optim.Muon's signature ---------------------------------------------

def test_import_muon_cpp_alone_gives_muon_cpp_optim():
    """In a fresh interpreter: this file's own import of muon_cpp.optim would hide its absence."""
    done = subprocess.run([sys.executable, "-c", "import muon_cpp; muon_cpp.optim.Muon"],
                          env={**os.environ, "PYTHONPATH": python_path()}, capture_output=True,
                          text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr


# torch.optim.Muon.__init__ of PyTorch's newest source (torch/optim/_muon.py, with the Gram
# Newton–Schulz keywords), as (name, default).
NEWEST_TORCH_SIGNATURE = [
    ("params", inspect.Parameter.empty), ("lr", 1e-3), ("weight_decay", 0.1), ("momentum", 0.95),
    ("nesterov", True), ("ns_coefficients", (3.4445, -4.7750, 2.0315)), ("eps", 1e-7),
    ("ns_steps", 5), ("adjust_lr_fn", None), ("use_gram_newton_schulz", False),
    ("gram_newton_schulz_config", None)]


def signature_of(cls):
    parameters = list(inspect.signature(cls.__init__).parameters.values())[1:]  # without self
    return [(p.name, p.default) for p in parameters], [p.kind for p in parameters]


def test_drop_in_has_torch_optim_muons_signature():
    ours, kinds = signature_of(OptimMuon)
    assert ours == NEWEST_TORCH_SIGNATURE
    assert set(kinds) == {inspect.Parameter.POSITIONAL_OR_KEYWORD}
    if TORCH_HAS_MUON:  # the installed torch's own: the same, or the same up to the Gram keywords
        theirs, their_kinds = signature_of(torch.optim.Muon)
        assert theirs == ours[:len(theirs)] and set(their_kinds) == set(kinds)
        assert len(theirs) == len(ours) or not TORCH_HAS_GRAM


def test_drop_in_param_groups_hold_torch_keys():
    w = torch.nn.Parameter(torch.randn(8, 16))
    group = OptimMuon([w]).param_groups[0]
    expected = dict(lr=1e-3, weight_decay=0.1, momentum=0.95, nesterov=True,
                    ns_coefficients=QUINTIC, eps=1e-7, ns_steps=5, adjust_lr_fn=None,
                    use_gram_newton_schulz=False, gram_ns_coefficients=DEFAULT_GRAM,
                    gram_ns_reset_iterations=[], use_cuda_graph=False)
    assert {key: value for key, value in group.items() if key != "params"} == expected
    if TORCH_HAS_GRAM:
        theirs = torch.optim.Muon([torch.nn.Parameter(torch.randn(8, 16))]).param_groups[0]
        assert {key: value for key, value in theirs.items() if key != "params"} == expected


@pytest.mark.parametrize("cls", [OptimMuon, muon_cpp.Muon])
def test_gram_config_is_checked_as_torch_checks_it(cls):
    w = torch.nn.Parameter(torch.randn(8, 16))
    with pytest.raises(ValueError, match=r"unknown keys \['bogus_key'\]; valid keys are "
                                         "gram_ns_coefficients, gram_ns_reset_iterations, "
                                         "use_cuda_graph"):
        cls([w], use_gram_newton_schulz=True, gram_newton_schulz_config={"bogus_key": 1})
    for config in ({"use_cuda_graph": True}, {}):
        with pytest.raises(ValueError, match="gram_newton_schulz_config is only valid when "
                                             "use_gram_newton_schulz=True"):
            cls([w], use_gram_newton_schulz=False, gram_newton_schulz_config=config)
    with pytest.raises(ValueError, match="only valid when use_gram_newton_schulz=True"):
        cls([w], gram_newton_schulz_config={})
    with pytest.raises(TypeError, match="use_gram_newton_schulz must be True or False, got str"):
        cls([w], use_gram_newton_schulz="yes", gram_newton_schulz_config={})
    with pytest.raises(ValueError, match=r"gram_ns_reset_iterations must be iteration indices "
                                         r">= 0, got \[-1\]"):
        cls([w], use_gram_newton_schulz=True,
            gram_newton_schulz_config={"gram_ns_reset_iterations": [-1]}).step()


def test_gram_config_defaults_and_overrides_in_param_groups():
    w = torch.nn.Parameter(torch.randn(8, 16))
    group = OptimMuon([w], use_gram_newton_schulz=True).param_groups[0]
    assert (group["gram_ns_coefficients"], group["gram_ns_reset_iterations"],
            group["use_cuda_graph"]) == (DEFAULT_GRAM, [], False)
    custom = [[1.0, -1.0, 0.5], [2.0, -2.0, 1.0]]
    group = OptimMuon([w], use_gram_newton_schulz=True,
                      gram_newton_schulz_config={"gram_ns_coefficients": custom}).param_groups[0]
    assert (group["gram_ns_coefficients"], group["gram_ns_reset_iterations"],
            group["use_cuda_graph"]) == (custom, [], False)
    group = OptimMuon([w], use_gram_newton_schulz=True, gram_newton_schulz_config={
        "gram_ns_coefficients": custom[:1], "gram_ns_reset_iterations": [0],
        "use_cuda_graph": True}).param_groups[0]
    assert (group["gram_ns_coefficients"], group["gram_ns_reset_iterations"],
            group["use_cuda_graph"]) == (custom[:1], [0], True)
    # muon_cpp.Muon keeps them under its own names.
    ours = muon_cpp.Muon([w], use_gram_newton_schulz=True, gram_newton_schulz_config={
        "gram_ns_coefficients": custom, "gram_ns_reset_iterations": [0, 1]}).param_groups[0]
    assert ours["gram_coefficients"] == custom
    assert ours["gram_restarts"] == (1,)
    assert not {"use_gram_newton_schulz", "gram_ns_coefficients", "use_cuda_graph"} & set(ours)
    assert muon_cpp.Muon([w]).param_groups[0]["gram_coefficients"] is None


# A Gram schedule unlike the standard one, so that which one ran shows in the result: a
# contracting first iteration, then the quintic; reset before iteration 2.
GRAM_SCHEDULE = {"gram_ns_coefficients": [[2.0, -1.5, 0.5]] + [list(QUINTIC)] * 5,
                 "gram_ns_reset_iterations": [2]}


@pytest.mark.parametrize("shape", [(6, 20), (20, 6), (12, 12)])
@pytest.mark.parametrize("cls", [OptimMuon, muon_cpp.Muon])
def test_gram_newton_schulz_follows_torch_square_matrices_the_standard_iteration(cls, shape):
    """Rectangular matrices iterate by gram_ns_coefficients (its own iteration count), square
    ones by ns_coefficients × ns_steps, as torch.optim.Muon does — in float64 to round-off."""
    settings = dict(lr=0.02, weight_decay=0.1, use_gram_newton_schulz=True,
                    gram_newton_schulz_config=GRAM_SCHEDULE)
    if cls is muon_cpp.Muon:
        settings["preset"] = "torch"
    ours = parameters([shape])
    theirs = [torch.nn.Parameter(p.detach().clone()) for p in ours]
    grads = random_grads([shape], steps=4, seed=1)
    run(cls(ours, **settings), ours, grads)
    settings.pop("preset", None)
    run(TranscribedMuon(theirs, **settings), theirs, grads)
    assert max_rel_diff(ours[0].detach(), theirs[0].detach()) < 1e-10
    # ... and differs from the standard iteration wherever the matrix is not square.
    standard = [torch.nn.Parameter(p.detach().clone()) for p in parameters([shape])]
    run(TranscribedMuon(standard, lr=0.02, weight_decay=0.1), standard, grads)
    difference = max_rel_diff(ours[0].detach(), standard[0].detach())
    assert (difference < 1e-10) == (shape[0] == shape[1])


def test_gram_switched_per_group_and_between_steps():
    shapes = [(6, 20), (6, 20)]
    ours, theirs = parameters(shapes), parameters(shapes)
    groups = lambda ps: [{"params": [ps[0]], "use_gram_newton_schulz": True},  # noqa: E731
                         {"params": [ps[1]], "use_gram_newton_schulz": False}]
    optimizer = OptimMuon(groups(ours), lr=0.02, use_gram_newton_schulz=True,
                          gram_newton_schulz_config=GRAM_SCHEDULE)
    reference = TranscribedMuon(groups(theirs), lr=0.02, use_gram_newton_schulz=True,
                                gram_newton_schulz_config=GRAM_SCHEDULE)
    grads = random_grads(shapes, steps=4, seed=2)
    run(optimizer, ours, grads[:2])
    run(reference, theirs, grads[:2])
    for opt in (optimizer, reference):  # written between steps, as torch code would
        opt.param_groups[1]["use_gram_newton_schulz"] = True
        opt.param_groups[0]["gram_ns_reset_iterations"] = []
    run(optimizer, ours, grads[2:])
    run(reference, theirs, grads[2:])
    for a, b in zip(ours, theirs):
        assert max_rel_diff(a.detach(), b.detach()) < 1e-10


@pytest.mark.parametrize("theirs_cls", [TranscribedMuon] + (
    [torch.optim.Muon] if TORCH_HAS_GRAM else []))
def test_gram_against_torch_optim_muon_itself(theirs_cls):
    """In float32, against the transcription and, where this PyTorch's Muon has the Gram keywords,
    against it: its Gram path runs in float16, so agreement is to that precision."""
    shapes = [(8, 32), (32, 8), (16, 16)]
    ours, theirs = parameters(shapes, dtype=torch.float32), parameters(shapes, dtype=torch.float32)
    grads = random_grads(shapes, steps=3, seed=3, dtype=torch.float32)
    run(OptimMuon(ours, lr=0.02, use_gram_newton_schulz=True), ours, grads)
    run(theirs_cls(theirs, lr=0.02, use_gram_newton_schulz=True), theirs, grads)
    start = parameters(shapes, dtype=torch.float32)
    for a, b, s in zip(ours, theirs, start):
        assert max_rel_diff(a.detach() - s.detach(), b.detach() - s.detach()) < (
            2e-5 if theirs_cls is TranscribedMuon else 2e-2)


# ---- named parameters ------------------------------------------------------------------------

OPTIMIZERS = [muon_cpp.Muon, muon_cpp.Dion, OptimMuon, muon_cpp.AdamW, muon_cpp.Adam,
              muon_cpp.Lamb]


@pytest.mark.parametrize("cls", OPTIMIZERS)
def test_named_parameters_on_every_optimizer(cls):
    model = torch.nn.Sequential(torch.nn.Linear(6, 8, bias=False), torch.nn.Linear(8, 4,
                                                                                   bias=False))
    twin = torch.nn.Sequential(torch.nn.Linear(6, 8, bias=False), torch.nn.Linear(8, 4,
                                                                                  bias=False))
    twin.load_state_dict(model.state_dict())
    named = cls(model.named_parameters())
    unnamed = cls(twin.parameters())
    assert named.param_groups[0]["param_names"] == ["0.weight", "1.weight"]
    assert "param_names" not in unnamed.param_groups[0]
    grads = random_grads([(8, 6), (4, 8)], steps=3, seed=4, dtype=torch.float32)
    run(named, list(model.parameters()), grads)
    run(unnamed, list(twin.parameters()), grads)
    for a, b in zip(model.parameters(), twin.parameters()):
        assert torch.equal(a, b)
    saved = named.state_dict()
    assert saved["param_groups"][0]["param_names"] == ["0.weight", "1.weight"]
    restored = cls(twin.named_parameters())
    restored.load_state_dict(saved)
    assert restored.param_groups[0]["param_names"] == ["0.weight", "1.weight"]
    with pytest.raises(ValueError, match="all optimizer params should be with/without names"):
        cls([("0.weight", model[0].weight), model[1].weight])
    with pytest.raises(ValueError, match="all optimizer param groups should be with/without "
                                         "names"):
        cls([{"params": [("0.weight", model[0].weight)]}, {"params": [model[1].weight]}])


def test_named_parameters_as_torch_optim_keeps_them():
    """Where torch.optim takes named parameters (2.6 on), its AdamW's state dict and ours carry
    the same names."""
    model = torch.nn.Linear(5, 3)
    ours = muon_cpp.AdamW(model.named_parameters())
    needs.torch_at_least(2, 6, "named parameters in torch.optim.AdamW")
    theirs = torch.optim.AdamW(model.named_parameters())
    assert (ours.state_dict()["param_groups"][0]["param_names"]
            == theirs.state_dict()["param_groups"][0]["param_names"] == ["weight", "bias"])


# ---- state dicts between muon-cpp and torch.optim.Muon ---------------------------------------

# The transcription everywhere; torch.optim.Muon where this PyTorch has it, with the Gram
# keywords where it has those.
TORCH_MUONS = [(TranscribedMuon, False), (TranscribedMuon, True)] + (
    [(torch.optim.Muon, False)] if TORCH_HAS_MUON else []) + (
    [(torch.optim.Muon, True)] if TORCH_HAS_GRAM else [])


@pytest.mark.parametrize("theirs_cls, gram", TORCH_MUONS)
@pytest.mark.parametrize("ours_cls", [muon_cpp.Muon, OptimMuon])
def test_state_dicts_move_both_ways_mid_run(ours_cls, theirs_cls, gram):
    """3 steps in muon-cpp, 3 in torch's Muon from muon-cpp's state dict, 3 more in muon-cpp
    from torch's: the same run as 9 steps in muon-cpp alone (torch's own Muon rounds to bfloat16
    or float16 inside its steps: compared at that precision)."""
    exact = theirs_cls is TranscribedMuon
    dtype = torch.float64 if exact else torch.float32
    shapes = [(6, 20), (12, 12)]
    settings = dict(lr=0.02, weight_decay=0.1, momentum=0.9, eps=1e-6,
                    adjust_lr_fn="match_rms_adamw")
    if gram:
        settings.update(use_gram_newton_schulz=True, gram_newton_schulz_config=GRAM_SCHEDULE)
    ours_extra = dict(preset="torch") if ours_cls is muon_cpp.Muon else {}
    grads = random_grads(shapes, steps=9, seed=5, dtype=dtype)

    stayed = parameters(shapes, dtype=dtype)
    run(ours_cls(stayed, **settings, **ours_extra), stayed, grads)

    moved = parameters(shapes, dtype=dtype)
    first = ours_cls(moved, **settings, **ours_extra)
    run(first, moved, grads[:3])
    saved = first.state_dict()
    for key in ("ns_coefficients", "eps", "adjust_lr_fn", "use_gram_newton_schulz",
                "gram_ns_coefficients", "gram_ns_reset_iterations", "use_cuda_graph"):
        assert key in saved["param_groups"][0], key
    middle = theirs_cls(moved, lr=1.0)  # its own settings come from the state dict
    middle.load_state_dict(saved)
    run(middle, moved, grads[3:6])
    last = ours_cls(moved)
    last.load_state_dict(middle.state_dict())
    assert last.param_groups[0]["lr"] == 0.02
    run(last, moved, grads[6:])

    start = parameters(shapes, dtype=dtype)
    for a, b, s in zip(moved, stayed, start):
        assert max_rel_diff(a.detach() - s.detach(), b.detach() - s.detach()) < (
            1e-10 if exact else 2e-2)
    buffer = last.state[moved[0]]["momentum_buffer"]
    assert buffer.dtype == dtype and buffer.shape == shapes[0]


# torch's optimizers a muon-cpp state dict can pass through mid-run: torch.optim.Muon keeps our
# 'step' and never advances it itself (muon_cpp advances it for it), torch.optim.AdamW advances it.
ROUND_TRIPS = ([(muon_cpp.Muon, torch.optim.Muon)] if TORCH_HAS_MUON else []) + [
    (muon_cpp.AdamW, torch.optim.AdamW)]


@pytest.mark.parametrize("state_dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("ours_cls, theirs_cls", ROUND_TRIPS)
def test_the_step_count_and_every_state_key_survive_a_trip_through_torch(ours_cls, theirs_cls,
                                                                          state_dtype):
    """3 steps in muon-cpp, 3 in torch's optimizer from its state dict, then back: the count is
    6, and muon-cpp goes on exactly as from torch's state with the count set to 6 by hand — every
    state key and every parameter bit for bit over 3 more steps (bf16 state too, whose stochastic
    rounding follows the count)."""
    shapes = [(6, 20), (12, 12)]
    grads = random_grads(shapes, steps=9, seed=7, dtype=torch.float32)
    moved = parameters(shapes, dtype=torch.float32)
    first = ours_cls(moved, lr=0.02, state_dtype=state_dtype)
    run(first, moved, grads[:3])
    middle = theirs_cls(moved)
    middle.load_state_dict(first.state_dict())
    run(middle, moved, grads[3:6])
    through = middle.state_dict()
    counted = copy.deepcopy(through)
    for state in counted["state"].values():
        state["step"] = torch.tensor(6.0)
    twins = [torch.nn.Parameter(p.detach().clone()) for p in moved]
    last, control = ours_cls(moved, state_dtype=state_dtype), ours_cls(twins, state_dtype=state_dtype)
    last.load_state_dict(through)
    control.load_state_dict(counted)
    assert [last.state[p]["step"].item() for p in moved] == [6.0, 6.0]
    run(last, moved, grads[6:])
    run(control, twins, grads[6:])
    for p, twin in zip(moved, twins):
        assert torch.equal(p, twin)
        ours, expected = last.state[p], control.state[twin]
        assert sorted(ours) == sorted(expected)
        for key in expected:
            assert ours[key].dtype == expected[key].dtype and torch.equal(ours[key], expected[key]), key
    assert last.state[moved[0]]["step"].item() == 9.0


def test_a_changed_torch_key_wins_over_the_stale_one_of_ours():
    w = parameters([(6, 10)])
    optimizer = muon_cpp.Muon(w, preset="torch")
    saved = optimizer.state_dict()
    assert saved["param_groups"][0]["coefficients"] == "quintic"
    saved["param_groups"][0]["eps"] = 1e-5  # as torch code would after loading it
    optimizer.load_state_dict(saved)
    group = optimizer.param_groups[0]
    assert group["ns_eps"] == 1e-5 and group["coefficients"] == "quintic"
    assert "eps" not in group

    # Two of torch's keys (use_gram_newton_schulz, gram_ns_coefficients) carry our one
    # gram_coefficients: torch code that changed both replaces it once, with their meaning.
    optimizer = muon_cpp.Muon(w, preset="torch", use_gram_newton_schulz=True)
    saved = optimizer.state_dict()
    saved["param_groups"][0].update(use_gram_newton_schulz=False,
                                    gram_ns_coefficients=[[3.0, -3.0, 1.0]] * 5)
    optimizer.load_state_dict(saved)
    group = optimizer.param_groups[0]
    assert group["gram_coefficients"] is None and "use_gram_newton_schulz" not in group


def test_groups_torch_cannot_run_carry_no_torch_keys():
    w = parameters([(6, 10)])
    saved = muon_cpp.Muon(w, coefficients="polar_express").state_dict()
    assert "ns_coefficients" not in saved["param_groups"][0]
    with pytest.raises(ValueError, match="uses settings torch.optim.Muon cannot express"):
        OptimMuon(parameters([(6, 10)])).load_state_dict(saved)
    muon_cpp.Muon(parameters([(6, 10)])).load_state_dict(saved)  # ours takes it
    with pytest.raises(ValueError, match="muon_cpp.optim.Muon takes torch.optim.Muon's names: "
                                         "give ns_coefficients, not coefficients"):
        OptimMuon([{"params": w, "coefficients": "polar_express"}])


# ---- PyTorch's frozen regression values -----------------------------------------------------

# test/optim/test_muon.py of PyTorch, TestMuonVanillaRegression: torch.manual_seed(42);
# p = randn(8, 4); Muon([p], lr=0.02, weight_decay=W, momentum=0.95, nesterov=N); 5 times
# p.grad = randn_like(p) and a step. Values recorded by PyTorch (bfloat16 Newton–Schulz).
EXPECTED_PARAM_NESTEROV_TRUE = [
    [1.938483476638794, 1.463821530342102, 0.8684228658676147, -2.107022762298584],
    [0.6464439034461975, -1.2333816289901733, -0.05520281195640564, -1.594115972518921],
    [-0.7017418742179871, 1.5892770290374756, -0.3630223572254181, -1.3906430006027222],
    [-0.6950568556785583, -0.6230637431144714, -0.7075115442276001, 0.7674455046653748],
    [1.6756398677825928, -0.14238590002059937, -0.4740765392780304, 0.41970568895339966],
    [-0.75552898645401, 1.045496940612793, 0.8197356462478638, 1.681230068206787],
    [1.2763956785202026, 1.2807981967926025, 0.6196531653404236, 1.2518298625946045],
    [-0.20052097737789154, 0.02047128602862358, -0.25045672059059143, 0.7741371989250183]]
EXPECTED_PARAM_NESTEROV_FALSE = [
    [1.9527949094772339, 1.4754483699798584, 0.8651961088180542, -2.1447465419769287],
    [0.6431010365486145, -1.2468913793563843, -0.0508497953414917, -1.615515112876892],
    [-0.7089078426361084, 1.601587176322937, -0.370036244392395, -1.3938430547714233],
    [-0.7046897411346436, -0.6338974237442017, -0.6964432597160339, 0.7840660214424133],
    [1.7094919681549072, -0.1214023157954216, -0.4710087776184082, 0.4312562346458435],
    [-0.7728015780448914, 1.0400207042694092, 0.8233118653297424, 1.6969393491744995],
    [1.2878977060317993, 1.301850438117981, 0.6351599097251892, 1.2659329175949097],
    [-0.2075868397951126, 0.010008741170167923, -0.25453078746795654, 0.7897554636001587]]
EXPECTED_BUF = [
    [-0.11098092794418335, 0.08274538069963455, 0.05440763011574745, 0.022694384679198265],
    [0.06464089453220367, 0.04171084985136986, 0.05522793158888817, -0.024408867582678795],
    [-0.10506078600883484, 0.16549666225910187, -0.036471910774707794, 0.048419296741485596],
    [-0.11045779287815094, 0.2032998502254486, -0.13876627385616302, 0.06581886857748032],
    [-0.14690940082073212, 0.005613995250314474, -0.0447036549448967, 0.0763719230890274],
    [0.0020838298369199038, -0.01441915426403284, -0.09339231252670288, -0.025113143026828766],
    [-0.0352008081972599, -0.03741401806473732, -0.16004668176174164, 0.17050980031490326],
    [-0.09506358951330185, 0.007350748870521784, 0.01989450491964817, 0.16971878707408905]]


@pytest.mark.parametrize("ns_dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("cls", [OptimMuon, muon_cpp.Muon])
@pytest.mark.parametrize("nesterov, weight_decay, expected", [
    (True, 0.1, EXPECTED_PARAM_NESTEROV_TRUE), (False, 0.0, EXPECTED_PARAM_NESTEROV_FALSE)])
def test_pytorchs_frozen_regression_values(cls, nesterov, weight_decay, expected, ns_dtype):
    """Our Newton–Schulz, in float32 and in bfloat16 as torch's (on bf16 dot products, or their
    emulation on a CPU without them), against torch's recorded bfloat16 one: the parameters within
    bfloat16 noise (each step moves them by 0.02·√2 in the spectral norm; bf16's relative
    rounding of the update is ~4e-3), the momentum buffer — no Newton–Schulz in it — to fp32."""
    torch.manual_seed(42)
    p = torch.nn.Parameter(torch.randn(8, 4))
    extra = dict(preset="torch") if cls is muon_cpp.Muon else {}
    optimizer = cls([{"params": [p], "ns_dtype": ns_dtype}], lr=0.02, weight_decay=weight_decay,
                    momentum=0.95, nesterov=nesterov, **extra)
    for _ in range(5):
        p.grad = torch.randn_like(p)
        optimizer.step()
    assert (p.detach() - torch.tensor(expected)).abs().max() < 3e-3
    buffer = optimizer.state[p]["momentum_buffer"]
    assert (buffer - torch.tensor(EXPECTED_BUF)).abs().max() < 1e-7


def test_bf16_newton_schulz_beside_torch_optim_muon():
    """Both chains in bfloat16 — torch's on its bf16 GEMM, ours on bf16 dot products or, on a CPU
    without them, their emulation in fp32 — from the same parameters and gradients, 5 steps: each
    moves every matrix as our fp32 chain does within bf16 noise (2e-2, the bound of the fp32
    side-by-side above), and ours is no fp32 chain (it differs from it)."""
    needs.torch_at_least(2, 9, "torch.optim.Muon")
    shapes = [(8, 4), (6, 20), (64, 48)]
    settings = dict(lr=0.02, weight_decay=0.1, momentum=0.95)
    grads = random_grads(shapes, steps=5, seed=8, dtype=torch.float32)
    start = parameters(shapes, dtype=torch.float32)
    moved = {}
    for name, make in [("torch", lambda ps: torch.optim.Muon(ps, **settings)),
                       ("ours bf16", lambda ps: OptimMuon(
                           [{"params": ps, "ns_dtype": torch.bfloat16}], **settings)),
                       ("ours fp32", lambda ps: OptimMuon(ps, **settings))]:
        params = parameters(shapes, dtype=torch.float32)
        run(make(params), params, grads)
        moved[name] = [p.detach() - s for p, s in zip(params, start)]
    for ours, theirs, fp32 in zip(moved["ours bf16"], moved["torch"], moved["ours fp32"]):
        assert max_rel_diff(ours, fp32) < 2e-2
        assert max_rel_diff(theirs, fp32) < 2e-2
        assert max_rel_diff(ours, fp32) > 1e-4
