"""muon-cpp's optimizers for PyTorch.

Every class here is a ``torch.optim.Optimizer`` whose update runs in muon-cpp's C++ library:
``param_groups`` are ordinary dicts (learning-rate schedulers write ``lr`` into them and the next
``step()`` uses it), ``state_dict()`` / ``load_state_dict()`` use PyTorch's layout, and
``zero_grad()`` is PyTorch's own. ``step_in_backward(optimizer)`` moves the updates into backward,
each parameter's as its gradient completes (docs/python.md §The step inside backward).

    model = MyModel()
    optimizer = muon_cpp.build_optimizer(model, "optimizer: muon\\nlr: 0.02\\n", total_steps=1000)
    for batch in data:
        loss = model(batch)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()

Errors: bad arguments and configurations raise ValueError (wrong types: TypeError) with the C++
message; problems found by ``step()`` (a sparse gradient, say) raise RuntimeError, as torch.optim does.
"""

import torch as _torch

from ._build_info import VERSION as __version__
from ._install import check_build as _check_build

_check_build(_torch.__version__)

from . import _core, _torch_muon  # noqa: E402 (after the check: a mismatched _core fails to load)
from ._aux_adam import MuonWithAuxAdam, SingleDeviceMuonWithAuxAdam
from ._dion import Dion
from ._engine import _EngineOptimizer
from ._schema import AMSGRAD as _AMSGRAD, USE_ADDMM as _USE_ADDMM
from ._hybrid import HybridOptimizer, build_optimizer
from ._in_backward import StepInBackward, step_in_backward
from . import optim  # noqa: F401 (muon_cpp.optim.Muon after a bare `import muon_cpp`)

_torch_muon.count_steps_through_torch_muon()

__all__ = [
    "Muon",
    "Dion",
    "AdamW",
    "Adam",
    "Lamb",
    "Lion",
    "HybridOptimizer",
    "build_optimizer",
    "MuonWithAuxAdam",
    "SingleDeviceMuonWithAuxAdam",
    "step_in_backward",
    "StepInBackward",
    "orthogonalize",
    "orthogonality_error",
]


# torch.optim.Muon's constructor keywords that muon_cpp.Muon also takes, with the option of
# ours each sets (docs/python.md §torch.optim.Muon).
_TORCH_MUON_KEYWORDS = {"ns_coefficients": "coefficients", "eps": "ns_eps",
                        "adjust_lr_fn": "adjust_lr", "use_gram_newton_schulz": "gram_coefficients",
                        "gram_newton_schulz_config": "gram_coefficients"}


# Other projects' settings for the matrices by name: the C++ table of presets (muon/presets.h),
# each a full set of one algorithm's settings in our names — torch and nanochat Muon's (dion's are
# Dion's own defaults).
_MUON_PRESETS = {name: settings for name, _origin, algorithm, settings in _core.muon_presets()
                 if algorithm == "muon"}
_PRESETS_ELSEWHERE = {name: f"muon_cpp.{algorithm.capitalize()}"
                      for name, _origin, algorithm, _ in _core.muon_presets() if algorithm != "muon"}


class Muon(_EngineOptimizer, algorithm="muon", positional=4, aliases=_TORCH_MUON_KEYWORDS,
           presets=_MUON_PRESETS, presets_elsewhere=_PRESETS_ELSEWHERE, own_flags=_USE_ADDMM):
    """Muon (docs/design.md §Muon update): momentum, then Newton–Schulz orthogonalization, for
    parameters of rank ≥ 2 (each matrix of a (batch..., rows, cols) tensor separately).

    ``Muon(params, lr=0.02, momentum=0.95, nesterov=True, weight_decay=0.0, *, ...)``; every
    option, its default and meaning: ``help(muon_cpp.Muon.__init__)`` or docs/python.md. Tensors
    may live on any device; on CUDA, Newton–Schulz runs in bfloat16 by default.

    torch.optim.Muon's keywords (``ns_coefficients``, ``eps``, ``adjust_lr_fn``,
    ``use_gram_newton_schulz``, ``gram_newton_schulz_config``) are accepted in the constructor,
    param groups and state dicts and stored under our names; its state dicts load and ours load
    into it; ``preset="torch"`` gives its defaults (lr 1e-3, weight_decay 0.1). The positional
    order is ours, not torch's (which has weight_decay second): the drop-in with torch's exact
    signature is ``muon_cpp.optim.Muon``; docs/python.md §torch.optim.Muon.
    ``preset="nanochat"`` gives nanochat's settings for its matrices (NorMuon, Polar Express
    coefficients, cautious weight decay 0.28); the presets: docs/algorithms.md §Presets. Dion is
    an algorithm of its own: ``Dion``.
    """

    _updates_matrices = True
    _updates_whole_tensors = True

    def _own_keys(self):
        return tuple(_TORCH_MUON_KEYWORDS) + _torch_muon.TORCH_ONLY_KEYS

    def _from_torch_names(self, settings):
        settings = super()._from_torch_names(settings)
        if settings.get("use_gram_newton_schulz", False) is None:  # the keyword's "not given"
            del settings["use_gram_newton_schulz"]
        if "gram_newton_schulz_config" in settings:  # the constructor's; torch groups are flat
            config = settings.pop("gram_newton_schulz_config")
            settings.update(_torch_muon.gram_group_keys(
                settings.get("use_gram_newton_schulz", False), config))
        return _torch_muon.to_ours(settings)

    def _state_dict(self):
        """PyTorch's layout, each group with our names and, where torch.optim.Muon can run the
        group as it is, also torch's (ns_coefficients, eps, adjust_lr_fn and the Gram keys), so
        that the state dict loads into torch.optim.Muon too."""
        out = super()._state_dict()
        for group in out["param_groups"]:
            group.update(_torch_muon.torch_view(group, _core.coefficient_table) or {})
        return out

    def _loaded_group(self, saved):
        if "dion" in saved:  # written when Dion was a Muon setting
            if saved["dion"] is not None:
                raise ValueError("this state dict ran Dion (its groups hold the Muon setting "
                                 "'dion' of earlier versions): load it into muon_cpp.Dion")
            del saved["dion"]
        return _torch_muon.drop_duplicates(
            saved, _torch_muon.torch_view(saved, _core.coefficient_table), keep="ours")


class AdamW(_EngineOptimizer, algorithm="adamw", positional=4, own_flags=_AMSGRAD):
    """AdamW with decoupled weight decay, as torch.optim.AdamW; ``nesterov=True`` gives NAdam
    (optax's form), ``state_dtype=torch.bfloat16`` stores both moments in bf16 with stochastic
    rounding, ``cautious=True`` masks the update (arXiv 2411.16085).

    ``AdamW(params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=1e-2, *, ...)``."""


class Adam(_EngineOptimizer, algorithm="adam", positional=4, own_flags=_AMSGRAD):
    """Adam with coupled (L2) weight decay, as torch.optim.Adam; options as AdamW's."""


class Lamb(_EngineOptimizer, algorithm="lamb", positional=4):
    """LAMB: the Adam direction plus weight decay, scaled by the trust ratio ‖W‖/‖r‖ (float32
    state; nesterov, cautious and bfloat16 state are refused)."""

    _updates_whole_tensors = True  # the trust ratio's norms are over the whole tensor


class Lion(_EngineOptimizer, algorithm="lion", positional=3):
    """Lion (Chen et al., arXiv 2302.06675): W ← W·(1 − lr·λ) − lr·sign(β1·m + (1−β1)·g), then
    m ← β2·m + (1−β2)·g. One state tensor, ``exp_avg`` (``state_dtype=torch.bfloat16`` stores it
    in bf16 with stochastic rounding).

    ``Lion(params, lr=1e-4, betas=(0.9, 0.99), weight_decay=0.0, *, ...)``: lion-pytorch's
    keywords and defaults; Lion wants a rate 3–10× smaller than AdamW's and a decay 3–10× larger."""


def orthogonalize(x, coefficients="quintic", steps=5, *, method="automatic", dtype=None,
                  gram_restarts=None):
    """Newton–Schulz orthogonalization (docs/design.md §Newton–Schulz orthogonalization) of each
    matrix in the last two dims of ``x``: approximately U·Vᵀ of its SVD. ``x`` is not modified.
    ``coefficients``: a table's name ({tables}) or rows [[a, b, c], ...]; ``method``:
    'automatic', 'plain', 'symmetric', 'gram'; ``dtype``: the working dtype (default float32 on
    CPU, float64 stays float64); ``gram_restarts``: the iteration counts after which 'gram' forms
    W and its Gram matrix afresh (strictly increasing, each >= 1; () for never; None: the table's
    default, every 2 at most in bfloat16)."""
    if not isinstance(x, _torch.Tensor):
        raise TypeError(f"x must be a torch.Tensor, got {type(x).__name__}")
    if isinstance(steps, bool) or not isinstance(steps, int):
        raise TypeError(f"steps must be an int, got {type(steps).__name__}")
    return _core.orthogonalize(x, coefficients, steps, method, dtype, gram_restarts)


orthogonalize.__doc__ = orthogonalize.__doc__.replace("{tables}", _core.coefficient_table_names())


def orthogonality_error(x):
    """max over the batch of ‖G − I‖_F / √k, G the k×k Gram matrix on the smaller side (0 for
    an exactly orthogonal result)."""
    return _core.orthogonality_error(x)
