"""torch.optim's Muon, run by muon-cpp: replacing

    from torch.optim import Muon

with

    from muon_cpp.optim import Muon

is the whole change. The constructor has torch.optim.Muon's signature and defaults (PyTorch's
newest, with the Gram Newton–Schulz keywords), param_groups hold torch's keys, and state dicts
move between the two in both directions mid-run (docs/python.md §torch.optim.Muon).
"""

from . import _core, _torch_muon
from ._engine import _EngineOptimizer, check_group_keys
from ._schema import check_torch_flags

__all__ = ["Muon"]

_QUINTIC = _torch_muon.QUINTIC
# torch.optim.Muon's defaults: the preset "torch" of muon-cpp's table (muon/presets.h).
_TORCH = {name: settings for name, _origin, _algorithm, settings in _core.muon_presets()}["torch"]


class Muon(_EngineOptimizer, algorithm="muon"):
    """torch.optim.Muon's interface on muon-cpp's Muon: momentum (EMA, Nesterov by default),
    Newton–Schulz orthogonalization and decoupled weight decay, for parameters of rank >= 2.

    Differences from torch.optim.Muon: on CPU the iterations run in float32 (torch: bfloat16,
    float16 on its Gram path), on GPUs in bfloat16; the normalization divides by ‖X‖_F + eps
    (torch: max(‖X‖_F, eps) on its standard path), a relative difference of about eps/‖X‖_F;
    parameters may be stacks of matrices (batch..., rows, cols); ``use_cuda_graph`` is accepted
    and changes nothing (muon-cpp captures no CUDA graphs). Any muon-cpp Muon option given in a
    param-group dict under its own name (ns_method, normuon, ...) is applied too.
    """

    _updates_matrices = True
    _updates_whole_tensors = True

    def __init__(self, params, lr=_TORCH["lr"], weight_decay=_TORCH["weight_decay"],
                 momentum=_TORCH["momentum"], nesterov=_TORCH["nesterov"],
                 ns_coefficients=_QUINTIC, eps=_TORCH["ns_eps"], ns_steps=_TORCH["ns_steps"],
                 adjust_lr_fn=None,
                 use_gram_newton_schulz=False, gram_newton_schulz_config=None):
        defaults = {"lr": lr, "weight_decay": weight_decay, "momentum": momentum,
                    "nesterov": nesterov, "ns_coefficients": ns_coefficients, "eps": eps,
                    "ns_steps": ns_steps, "adjust_lr_fn": adjust_lr_fn}
        defaults.update(_torch_muon.gram_group_keys(use_gram_newton_schulz,
                                                    gram_newton_schulz_config))
        super().__init__(params, defaults)

    def _from_torch_names(self, settings):
        check_torch_flags(settings, "Muon")
        check_group_keys(settings, "Muon", "muon", _torch_muon.TORCH_ONLY_KEYS)
        ours = [key for key, counterpart in _torch_muon.COUNTERPARTS.items()
                if counterpart in settings and key not in settings]
        if ours:
            raise ValueError(f"muon_cpp.optim.Muon takes torch.optim.Muon's names: give "
                             f"{ours[0]}, not {_torch_muon.COUNTERPARTS[ours[0]]}")
        return settings

    def _engine_settings(self, group):
        settings = {key: value for key, value in group.items() if key != "params"}
        return _torch_muon.to_ours(settings)

    def _loaded_group(self, saved):
        """A group of a torch.optim.Muon state dict as it is; one of muon_cpp.Muon's (our names
        beside torch's) in torch's names only — refused when torch's names cannot express it."""
        view = _torch_muon.torch_view(saved, _core.coefficient_table)
        if view is None:
            raise ValueError("a param group of this state dict uses settings torch.optim.Muon "
                             "cannot express (another momentum form or decay method, a "
                             "coefficient table of several rows, NorMuon, Dion, ...); load it "
                             "into muon_cpp.Muon")
        saved = _torch_muon.drop_duplicates(saved, view, keep="torch")
        for theirs, ours in _torch_muon.COUNTERPARTS.items():
            if ours in saved and theirs not in saved:
                saved.pop(ours)
                saved[theirs] = view[theirs]
        return saved
