"""KellerJordan/Muon's MuonWithAuxAdam and SingleDeviceMuonWithAuxAdam on muon-cpp's kernels: one
optimizer over param groups that each say ``use_muon`` — True: Muon, False: Adam (AdamW's
decoupled decay) — with KellerJordan/Muon's keys and defaults (github.com/KellerJordan/Muon,
muon.py; docs/python.md §KellerJordan/Muon)."""

import torch

from . import _core
from ._engine import _EngineOptimizer, check_group_keys
from ._schema import check_torch_flags

# KellerJordan/Muon's defaults of each kind of group, under its keys.
MUON_GROUP_DEFAULTS = {"lr": 0.02, "momentum": 0.95, "weight_decay": 0}
ADAM_GROUP_DEFAULTS = {"lr": 3e-4, "betas": (0.9, 0.95), "eps": 1e-10, "weight_decay": 0}
# What KellerJordan/Muon's Muon does that muon-cpp's Muon options say otherwise by default: it
# normalizes by ‖X‖_F + 1e-7 before Newton–Schulz. (The rest — EMA momentum with Nesterov, the
# quintic five times, the shape factor √max(1, rows/cols), decoupled decay — are our defaults.)
_MUON_ENGINE_DEFAULTS = {"ns_eps": 1e-7}


class SingleDeviceMuonWithAuxAdam(_EngineOptimizer):
    """KellerJordan/Muon's SingleDeviceMuonWithAuxAdam, run by muon-cpp's kernels.

    ``SingleDeviceMuonWithAuxAdam(param_groups, *, process_group=None)``: every group says
    ``use_muon``. Muon groups (``use_muon=True``: lr 0.02, momentum 0.95, weight_decay 0) take
    matrices — a 4-D conv kernel is orthogonalized as (out, in·kh·kw), as KellerJordan/Muon views
    it; Adam groups (``use_muon=False``: lr 3e-4, betas (0.9, 0.95), eps 1e-10, weight_decay 0)
    take anything. A group may also carry muon-cpp's own options of its algorithm (ns_steps,
    nesterov, state_dtype, ...); an option of the other algorithm (betas in a Muon group, momentum
    in an Adam group) is a ValueError, as is a group without use_muon. Parameters without a
    gradient are left as they are (KellerJordan/Muon steps them with a zero gradient).
    ``process_group`` shares the updates over ranks as the other optimizers here do (each
    parameter updated on one owner rank; DDP averages the gradients first).
    """

    _sorts_muon_params = False  # MuonWithAuxAdam orders a Muon group's matrices largest first
    _updates_whole_tensors = True  # the Muon groups' matrices

    def __init__(self, param_groups, *, process_group=None):
        super().__init__(param_groups, {}, process_group=process_group)

    def add_param_group(self, param_group):
        if isinstance(param_group, dict):
            param_group = self._with_defaults(dict(param_group))
        super().add_param_group(param_group)

    def _with_defaults(self, group):
        kind = _kind(group, type(self).__name__)
        for key, value in (MUON_GROUP_DEFAULTS if kind else ADAM_GROUP_DEFAULTS).items():
            group.setdefault(key, value)
        if kind and self._sorts_muon_params and "params" in group:
            group["params"] = sorted(_listed(group["params"]), key=lambda p: tuple(p.shape),
                                     reverse=True)
        return group

    def _from_torch_names(self, settings):
        who = type(self).__name__
        check_torch_flags(settings, who)
        kind = _kind(settings, who)
        check_group_keys({key: value for key, value in settings.items() if key != "use_muon"},
                         who, "muon" if kind else "adamw")
        return settings

    def _group_kind(self, group):
        return group.get("use_muon")

    def _matrix_flags(self):
        return [bool(group["use_muon"]) for group in self.param_groups for _ in group["params"]]

    def _engine_settings(self, group):
        settings = {key: value for key, value in group.items() if key not in ("params", "use_muon")}
        return dict(_MUON_ENGINE_DEFAULTS, **settings) if group["use_muon"] else settings

    def _new_engine(self, shards):
        held = (lambda p: p) if shards is None else shards.engine_tensor
        groups = [([held(p) for p in group["params"]], "muon" if group["use_muon"] else "adamw",
                   self._engine_settings(group)) for group in self.param_groups]
        views = [(held(p), [p.shape[0], p[0].numel()]) for group in self.param_groups
                 if group["use_muon"] for p in group["params"] if p.dim() == 4]
        return _core.Engine.grouped(groups, views)

    def _state_dict(self):
        """PyTorch's layout with KellerJordan/Muon's state: each step count an int, as its class
        keeps it (a float tensor there would compute Adam's bias corrections in float32)."""
        out = super()._state_dict()
        for entry in out["state"].values():
            entry["step"] = int(entry["step"])
        return out

    def _check_extra(self, state_dict):
        for number, (ours, saved) in enumerate(zip(self.param_groups,
                                                   state_dict["param_groups"])):
            if "use_muon" in saved and bool(saved["use_muon"]) != bool(ours["use_muon"]):
                raise ValueError(f"loaded state dict's param group {number} has use_muon="
                                 f"{saved['use_muon']!r}, this optimizer's {ours['use_muon']!r}")


class MuonWithAuxAdam(SingleDeviceMuonWithAuxAdam):
    """KellerJordan/Muon's MuonWithAuxAdam, run by muon-cpp's kernels: SingleDeviceMuonWithAuxAdam
    that orders each Muon group's matrices largest first, as KellerJordan/Muon does (so that its
    state dicts' indices match), and shares the updates over ``process_group`` (None: one
    process; KellerJordan/Muon's splits the Muon groups over the default group — pass
    ``process_group=torch.distributed.group.WORLD`` for that)."""

    _sorts_muon_params = True


def _kind(group, who):
    """Whether a KellerJordan/Muon param group is Muon's (its use_muon, which every group needs)."""
    if "use_muon" not in group:
        raise ValueError(f"{who}: every param group needs use_muon (True: Muon, False: Adam), as "
                         "KellerJordan/Muon's does; a group has only "
                         + ", ".join(repr(key) for key in group))
    if not isinstance(group["use_muon"], bool):
        raise TypeError(f"{who}: use_muon must be True or False, got "
                        f"{type(group['use_muon']).__name__}")
    return group["use_muon"]


def _listed(params):
    return [params] if isinstance(params, torch.Tensor) else list(params)
