"""muon_cpp.Muon with torch.optim.Muon's keywords (against TranscribedMuon, helpers.py), torch.optim's
implementation flags on every optimizer, and the weight-decay methods, MuonEq and ns_eps from
Python. The drop-in muon_cpp.optim.Muon and the Gram keywords: test_torch_optim_muon.py."""

import pytest
import torch

import muon_cpp
import needs
from helpers import QUINTIC, TranscribedMuon, max_rel_diff


def run_both(ours_settings, reference_settings, shape=(24, 10), steps=5, dtype=torch.float64,
             seed=3):
    """muon_cpp.Muon beside TranscribedMuon (torch.optim.Muon's step in the parameter's dtype)."""
    generator = torch.Generator().manual_seed(seed)
    start = torch.randn(shape, generator=generator, dtype=dtype)
    ours = torch.nn.Parameter(start.clone())
    theirs = torch.nn.Parameter(start.clone())
    optimizer = muon_cpp.Muon([ours], **ours_settings)
    reference = TranscribedMuon([theirs], **reference_settings)
    for _ in range(steps):
        grad = torch.randn(shape, generator=generator, dtype=dtype)
        ours.grad, theirs.grad = grad.clone(), grad.clone()
        optimizer.step()
        reference.step()
    return optimizer, ours, theirs, start


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("shape", [(24, 10), (10, 24)])
@pytest.mark.parametrize("settings", [
    dict(),
    dict(adjust_lr_fn="original", nesterov=False, weight_decay=0.0),
    dict(adjust_lr_fn="match_rms_adamw", momentum=0.9, lr=0.01),
    dict(ns_coefficients=(3.9505, -6.3029, 2.6377), eps=1e-6, ns_steps=7),
])
def test_torch_keywords_follow_torch_optim_muon(settings, shape, dtype):
    """Every torch.optim.Muon keyword, at torch's defaults where not given (preset='torch')."""
    optimizer, ours, theirs, start = run_both(dict(preset="torch", **settings), settings, shape,
                                              dtype=dtype)
    # float32: the fast products against the plain chain, up to 7 iterations.
    tolerance = 1e-10 if dtype == torch.float64 else 3e-4
    assert max_rel_diff(ours.detach() - start, theirs.detach() - start) < tolerance
    group = optimizer.param_groups[0]
    # Stored under muon-cpp's names only.
    assert not {"ns_coefficients", "eps", "adjust_lr_fn"} & set(group)
    assert group["adjust_lr"] == settings.get("adjust_lr_fn") or (
        group["adjust_lr"] == "original" and settings.get("adjust_lr_fn") is None)


def test_torch_normalization_differs_by_eps_only():
    """Against torch's own max(‖X‖_F, eps): the results differ by about eps/‖X‖_F (amplified by
    the iterations' slope at small singular values), far below bfloat16's resolution."""
    _, ours, theirs, start = run_both(dict(preset="torch"), dict(exact_eps=True))
    difference = max_rel_diff(ours.detach() - start, theirs.detach() - start)
    assert 0 < difference < 1e-5


def test_preset_torch_gives_torch_defaults():
    w = torch.nn.Parameter(torch.randn(6, 4))
    group = muon_cpp.Muon([w], preset="torch").param_groups[0]
    assert (group["lr"], group["weight_decay"], group["momentum"], group["nesterov"]) == (
        1e-3, 0.1, 0.95, True)
    assert (group["coefficients"], group["ns_eps"], group["ns_steps"]) == ("quintic", 1e-7, 5)
    ours = muon_cpp.Muon([w]).param_groups[0]  # without the preset: muon-cpp's own defaults
    assert (ours["lr"], ours["weight_decay"], ours["ns_eps"]) == (0.02, 0.0, None)
    explicit = muon_cpp.Muon([w], preset="torch", lr=0.05).param_groups[0]
    assert (explicit["lr"], explicit["weight_decay"]) == (0.05, 0.1)


def test_torch_names_in_param_groups_and_between_steps():
    generator = torch.Generator().manual_seed(5)
    start = torch.randn(12, 20, generator=generator, dtype=torch.float64)
    ours = torch.nn.Parameter(start.clone())
    theirs = torch.nn.Parameter(start.clone())
    optimizer = muon_cpp.Muon([{"params": [ours], "eps": 1e-6, "ns_coefficients": QUINTIC}],
                              preset="torch")
    reference = TranscribedMuon([theirs], eps=1e-6)
    for step in range(4):
        if step == 2:  # written between steps under torch's name, as torch code would
            for opt in (optimizer, reference):
                opt.param_groups[0]["adjust_lr_fn"] = "match_rms_adamw"
        grad = torch.randn(12, 20, generator=generator, dtype=torch.float64)
        ours.grad, theirs.grad = grad.clone(), grad.clone()
        optimizer.step()
        reference.step()
    assert max_rel_diff(ours.detach() - start, theirs.detach() - start) < 1e-10
    group = optimizer.param_groups[0]
    assert group["adjust_lr"] == "match_rms_adamw" and "adjust_lr_fn" not in group
    # torch's default row is the quintic table (its Gram restart points too); any other row is
    # a table of its own.
    assert group["ns_eps"] == 1e-6 and group["coefficients"] == "quintic"
    optimizer.param_groups[0]["ns_coefficients"] = (3.4445, -4.775, 2.03)
    optimizer.step()
    assert optimizer.param_groups[0]["coefficients"] == [[3.4445, -4.775, 2.03]]


def torch_layout_state_dict(buffer, **group):
    """A state dict as torch.optim.Muon.state_dict() writes it: momentum_buffer only, torch's
    group keys."""
    settings = dict(lr=1e-3, weight_decay=0.1, momentum=0.95, nesterov=True,
                    ns_coefficients=QUINTIC, eps=1e-7, ns_steps=5, adjust_lr_fn=None)
    settings.update(group)
    return {"state": {0: {"momentum_buffer": buffer.clone()}},
            "param_groups": [dict(settings, params=[0])]}


def test_loads_a_torch_optim_muon_state_dict_and_continues_its_run():
    generator = torch.Generator().manual_seed(8)
    start = torch.randn(16, 8, generator=generator, dtype=torch.float64)
    buffer = torch.randn(16, 8, generator=generator, dtype=torch.float64)
    ours = torch.nn.Parameter(start.clone())
    theirs = torch.nn.Parameter(start.clone())
    optimizer = muon_cpp.Muon([ours])  # muon-cpp's defaults, replaced by the loaded ones
    optimizer.load_state_dict(torch_layout_state_dict(buffer, lr=0.01, eps=1e-6,
                                                      adjust_lr_fn="match_rms_adamw"))
    reference = TranscribedMuon([theirs], lr=0.01, eps=1e-6, adjust_lr_fn="match_rms_adamw")
    reference.state[theirs]["momentum_buffer"] = buffer.clone()
    for _ in range(3):
        grad = torch.randn(16, 8, generator=generator, dtype=torch.float64)
        ours.grad, theirs.grad = grad.clone(), grad.clone()
        optimizer.step()
        reference.step()
    assert max_rel_diff(ours.detach() - start, theirs.detach() - start) < 1e-10
    state = optimizer.state_dict()["state"][0]
    assert torch.allclose(state["momentum_buffer"], reference.state[theirs]["momentum_buffer"])


def test_against_torch_optim_muon_itself():
    """Where PyTorch has Muon (2.9 on): its own step (bfloat16 Newton–Schulz) against ours."""
    needs.torch_at_least(2, 9, "torch.optim.Muon")
    generator = torch.Generator().manual_seed(9)
    start = torch.randn(32, 16, generator=generator)
    ours, theirs = torch.nn.Parameter(start.clone()), torch.nn.Parameter(start.clone())
    optimizer = muon_cpp.Muon([ours], preset="torch", lr=0.02)
    reference = torch.optim.Muon([theirs], lr=0.02)
    for _ in range(3):
        grad = torch.randn(32, 16, generator=generator)
        ours.grad, theirs.grad = grad.clone(), grad.clone()
        optimizer.step()
        reference.step()
    # torch orthogonalizes in bfloat16, we in float32 on CPU: agreement to bf16's precision.
    assert max_rel_diff(ours.detach() - start, theirs.detach() - start) < 5e-2
    optimizer.load_state_dict(reference.state_dict())
    assert torch.equal(optimizer.state[ours]["momentum_buffer"],
                       reference.state[theirs]["momentum_buffer"])


def test_torch_name_errors():
    w = torch.nn.Parameter(torch.randn(4, 4))
    with pytest.raises(ValueError, match="give coefficients or ns_coefficients"):
        muon_cpp.Muon([w], coefficients="quintic", ns_coefficients=QUINTIC)
    with pytest.raises(ValueError, match=r"adjust_lr_fn must be None, 'original' or "
                                         r"'match_rms_adamw'.*got 'spectral'"):
        muon_cpp.Muon([w], adjust_lr_fn="spectral")
    with pytest.raises(ValueError,
                       match=r"preset must be None .* or one of 'torch', 'nanochat', got 'jax'"):
        muon_cpp.Muon([w], preset="jax")
    with pytest.raises(ValueError, match="ns_eps must be > 0"):
        muon_cpp.Muon([w], eps=0.0)
    with pytest.raises(TypeError, match=r"ns_coefficients must be \(a, b, c\), a table name or "
                                        r"\[\[a, b, c\], ...\], got float 3.0"):
        muon_cpp.Muon([w], ns_coefficients=3.0)
    before = w.detach().clone()
    optimizer = muon_cpp.Muon([w])
    optimizer.param_groups[0]["adjust_lr_fn"] = "bad"
    w.grad = torch.ones(4, 4)
    with pytest.raises(ValueError, match="adjust_lr_fn"):
        optimizer.step()
    assert torch.equal(w.detach(), before)


@pytest.mark.parametrize("cls", [muon_cpp.Muon, muon_cpp.AdamW, muon_cpp.Adam, muon_cpp.Lamb])
def test_torch_implementation_flags(cls):
    w = torch.nn.Parameter(torch.randn(4, 4))
    for foreach in (None, True, False):
        optimizer = cls([w], foreach=foreach, maximize=False, capturable=False,
                        differentiable=False)
        assert "foreach" not in optimizer.param_groups[0]
    for flag, why in [("maximize", "negate the loss"), ("capturable", "CUDA graph"),
                      ("differentiable", "outside autograd")]:
        with pytest.raises(ValueError, match=f"{cls.__name__}: {flag}=True is not supported; "
                                             f".*{why}"):
            cls([w], **{flag: True})
    with pytest.raises(TypeError, match="maximize must be a bool, got str"):
        cls([w], maximize="yes")
    with pytest.raises(TypeError, match="foreach must be a bool or None, got int"):
        cls([w], foreach=1)


@pytest.mark.parametrize("cls", [muon_cpp.AdamW, muon_cpp.Adam])
def test_amsgrad_is_accepted_off_and_refused_on(cls):
    w = torch.nn.Parameter(torch.randn(4, 4))
    assert "amsgrad" not in cls([w], amsgrad=False).param_groups[0]
    with pytest.raises(ValueError, match=f"{cls.__name__}: amsgrad=True is not supported; "
                                         "AMSGrad's running maximum"):
        cls([w], amsgrad=True)
    # A torch state dict saved with amsgrad=True is refused too, before anything changes.
    reference = getattr(torch.optim, cls.__name__)([torch.nn.Parameter(w.detach().clone())],
                                                   amsgrad=True)
    optimizer = cls([w])
    with pytest.raises(ValueError, match="amsgrad=True is not supported"):
        optimizer.load_state_dict(reference.state_dict())
    assert optimizer.param_groups[0]["lr"] == 1e-3


def test_muon_takes_use_addmm_either_way_with_the_same_step():
    start = torch.randn(8, 6, generator=torch.Generator().manual_seed(3))
    grad = torch.randn(8, 6, generator=torch.Generator().manual_seed(4))
    results = []
    for use_addmm in (True, False, None):
        w = torch.nn.Parameter(start.clone())
        optimizer = muon_cpp.Muon([w], use_addmm=use_addmm)
        assert "use_addmm" not in optimizer.param_groups[0]
        w.grad = grad.clone()
        optimizer.step()
        results.append(w.detach())
    assert torch.equal(results[0], results[1]) and torch.equal(results[0], results[2])
    with pytest.raises(TypeError, match="use_addmm must be a bool or None, got str"):
        muon_cpp.Muon([torch.nn.Parameter(start.clone())], use_addmm="yes")


def test_a_preset_takes_the_options_after_lr_by_keyword():
    w = torch.nn.Parameter(torch.randn(4, 4))
    # torch.optim.Muon([w], 0.02, 0.1) means weight_decay 0.1; ours would read momentum 0.1.
    with pytest.raises(TypeError, match=r"Muon: with preset='torch' give the options after lr by "
                                        r"keyword: the positional order here is \(lr, momentum, "
                                        r"nesterov, weight_decay\).*muon_cpp\.optim\.Muon"):
        muon_cpp.Muon([w], 0.02, 0.1, preset="torch")
    group = muon_cpp.Muon([w], 0.02, preset="torch", weight_decay=0.1).param_groups[0]
    assert (group["lr"], group["weight_decay"], group["momentum"]) == (0.02, 0.1, 0.95)


def test_dion_takes_microsoft_dions_keywords_where_they_change_nothing():
    start = torch.randn(12, 8, generator=torch.Generator().manual_seed(5))
    grads = [torch.randn(12, 8, generator=torch.Generator().manual_seed(6 + k)) for k in range(3)]

    def run(**keywords):
        w = torch.nn.Parameter(start.clone())
        optimizer = muon_cpp.Dion([w], rank_fraction=0.5, **keywords)
        for g in grads:
            w.grad = g.clone()
            optimizer.step()
        return w.detach()

    plain = run()
    for keywords in ({"qr_method": "qr"}, {"qr_method": "cqr", "cqr_warmup_steps": 0},
                     {"rcqr_oversample": 2.0, "power_iters": 1, "betas": (0.9, 0.95)},
                     {"replicate_mesh": None, "replicate_mesh_grad_sync": False,
                      "mixed_precision_config": None}):
        assert torch.equal(run(**keywords), plain), keywords
    w = [torch.nn.Parameter(start.clone())]
    for keywords, message in [
            ({"power_iters": 2}, "Dion: power_iters must be 1"),
            ({"qr_method": "svd"}, "Dion: qr_method must be 'qr', 'cqr' or 'rcqr', got 'svd'"),
            ({"betas": (0.8, 0.99)}, r"Dion: betas \(0.8, 0.99\) would do nothing"),
            ({"replicate_mesh": object()}, "Dion: replicate_mesh must be None"),
            ({"mixed_precision_config": {}}, "Dion: mixed_precision_config must be None"),
            ({"rcqr_oversample": 0.5}, "Dion: rcqr_oversample must be a number >= 1")]:
        with pytest.raises(ValueError, match=message):
            muon_cpp.Dion(w, **keywords)


def test_loads_a_torch_adamw_state_dict_with_its_flags():
    generator = torch.Generator().manual_seed(10)
    start = torch.randn(6, 5, generator=generator)
    ours, theirs = torch.nn.Parameter(start.clone()), torch.nn.Parameter(start.clone())
    reference = torch.optim.AdamW([theirs], lr=0.01, weight_decay=0.1)
    for _ in range(2):
        theirs.grad = torch.randn(6, 5, generator=generator)
        reference.step()
    optimizer = muon_cpp.AdamW([ours])
    with torch.no_grad():
        ours.copy_(theirs)
    optimizer.load_state_dict(reference.state_dict())  # carries foreach, maximize, capturable, ...
    for _ in range(3):
        grad = torch.randn(6, 5, generator=generator)
        ours.grad, theirs.grad = grad.clone(), grad.clone()
        optimizer.step()
        reference.step()
    assert max_rel_diff(ours.detach(), theirs.detach()) < 1e-6


# Each method as torch.optim writes it: l2 is torch.optim.Adam's decay; the others are
# torch.optim.AdamW at the λ that gives the same factor (independent λ/lr, palm lr·λ).
@pytest.mark.parametrize("method, torch_optimizer, as_torch", [
    ("decoupled", torch.optim.AdamW, lambda lr, wd: wd),
    ("independent", torch.optim.AdamW, lambda lr, wd: wd / lr),
    ("palm", torch.optim.AdamW, lambda lr, wd: wd * lr),
    ("l2", torch.optim.Adam, lambda lr, wd: wd)])
@pytest.mark.parametrize("cls", [muon_cpp.AdamW, muon_cpp.Adam])
def test_adam_weight_decay_methods_equal_their_torch_forms(cls, method, torch_optimizer, as_torch):
    generator = torch.Generator().manual_seed(11)
    start = torch.randn(7, 3, generator=generator, dtype=torch.float64)
    ours, theirs = torch.nn.Parameter(start.clone()), torch.nn.Parameter(start.clone())
    lr, wd = 0.02, 0.3
    optimizer = cls([ours], lr=lr, weight_decay=wd, weight_decay_method=method)
    reference = torch_optimizer([theirs], lr=lr, weight_decay=as_torch(lr, wd))
    for _ in range(20):
        grad = torch.randn(7, 3, generator=generator, dtype=torch.float64)
        ours.grad, theirs.grad = grad.clone(), grad.clone()
        optimizer.step()
        reference.step()
    assert max_rel_diff(ours.detach(), theirs.detach()) < 1e-10


def test_weight_decay_method_defaults_and_refusals():
    w = torch.nn.Parameter(torch.randn(3))
    assert muon_cpp.AdamW([w]).param_groups[0]["weight_decay_method"] == "decoupled"
    assert muon_cpp.Adam([w]).param_groups[0]["weight_decay_method"] == "l2"
    with pytest.raises(ValueError, match="Lamb: weight_decay_method l2 is not supported"):
        muon_cpp.Lamb([w], weight_decay_method="l2")
    with pytest.raises(ValueError, match="weight_decay_method.*valid methods are decoupled, "
                                         "independent, l2, palm"):
        muon_cpp.AdamW([w], weight_decay_method="lr2")


def test_new_muon_options_survive_state_dict_and_yaml():
    w = torch.nn.Parameter(torch.randn(8, 6))
    settings = dict(weight_decay=0.1, weight_decay_method="palm", row_equilibration=True,
                    ns_eps=1e-5, coefficients="cans")
    optimizer = muon_cpp.Muon([w], **settings)
    w.grad = torch.randn(8, 6)
    optimizer.step()
    saved = optimizer.state_dict()
    restored = muon_cpp.Muon([torch.nn.Parameter(w.detach().clone())])
    restored.load_state_dict(saved)
    for key, value in settings.items():
        assert restored.param_groups[0][key] == value
    model = torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.ReLU(), torch.nn.Linear(8, 8),
                                torch.nn.Linear(8, 2))
    hybrid = muon_cpp.build_optimizer(model, {"optimizer": {
        "name": "muon", "weight_decay_method": "independent", "weight_decay": 1e-3,
        "muon": {"row_equilibration": True, "ns_eps": 1e-5, "coefficients": "deepseekv4",
                 "ns_steps": 10}}}, total_steps=10)
    assert "muon" in [group["algorithm"] for group in hybrid.param_groups]
    with pytest.raises(ValueError, match="optimizer.muon.weight_decay_method: unknown weight "
                                         "decay method 'lr2'"):
        muon_cpp.build_optimizer(model, {"optimizer": {"muon": {"weight_decay_method": "lr2"}}},
                                 total_steps=10)
