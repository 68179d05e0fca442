"""muon-cpp's optimizers for PyTorch.

Every class here is a ``torch.optim.Optimizer`` whose update runs in muon-cpp's C++ library:
``param_groups`` are ordinary dicts (learning-rate schedulers write ``lr`` into them and the next
``step()`` uses it), ``state_dict()`` / ``load_state_dict()`` use PyTorch's layout, and
``zero_grad()`` is PyTorch's own.

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

import datetime
import json
import os

import torch

from . import _core, _torch_muon
from ._dion import Dion
from ._distributed import check_group
from ._engine import AMSGRAD, USE_ADDMM, _EngineOptimizer
from ._sharded import HeldQkClipSource, is_sharded, sharded_hybrid
from ._schema import init_from_schema as _init_from_schema

__all__ = [
    "Muon",
    "Dion",
    "AdamW",
    "Adam",
    "Lamb",
    "Lion",
    "HybridOptimizer",
    "build_optimizer",
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


class Muon(_EngineOptimizer):
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

    _make_engine = staticmethod(_core.Engine.muon)
    _updates_matrices = True
    _updates_whole_tensors = True
    _own_torch_flags = USE_ADDMM
    __init__ = _init_from_schema("muon", positional=4, aliases=_TORCH_MUON_KEYWORDS,
                                 presets=_MUON_PRESETS, presets_elsewhere=_PRESETS_ELSEWHERE,
                                 own_flags=USE_ADDMM)

    def _from_torch_names(self, settings):
        settings = super()._from_torch_names(settings)
        if settings.get("use_gram_newton_schulz", False) is None:  # the keyword's "not given"
            del settings["use_gram_newton_schulz"]
        if "gram_newton_schulz_config" in settings:  # the constructor's; torch groups are flat
            config = settings.pop("gram_newton_schulz_config")
            settings.update(_torch_muon.gram_group_keys(
                settings.get("use_gram_newton_schulz", False), config))
        return _torch_muon.to_ours(settings)

    def state_dict(self):
        """PyTorch's layout, each group with our names and, where torch.optim.Muon can run the
        group as it is, also torch's (ns_coefficients, eps, adjust_lr_fn and the Gram keys), so
        that the state dict loads into torch.optim.Muon too."""
        out = super().state_dict()
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


class AdamW(_EngineOptimizer):
    """AdamW with decoupled weight decay, as torch.optim.AdamW; ``nesterov=True`` gives NAdam
    (optax's form), ``state_dtype=torch.bfloat16`` stores both moments in bf16 with stochastic
    rounding, ``cautious=True`` masks the update (arXiv 2411.16085).

    ``AdamW(params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=1e-2, *, ...)``."""

    _make_engine = staticmethod(_core.Engine.adamw)
    _own_torch_flags = AMSGRAD
    __init__ = _init_from_schema("adamw", positional=4, own_flags=AMSGRAD)


class Adam(_EngineOptimizer):
    """Adam with coupled (L2) weight decay, as torch.optim.Adam; options as AdamW's."""

    _make_engine = staticmethod(_core.Engine.adam)
    _own_torch_flags = AMSGRAD
    __init__ = _init_from_schema("adam", positional=4, own_flags=AMSGRAD)


class Lamb(_EngineOptimizer):
    """LAMB: the Adam direction plus weight decay, scaled by the trust ratio ‖W‖/‖r‖ (float32
    state; nesterov, cautious and bfloat16 state are refused)."""

    _make_engine = staticmethod(_core.Engine.lamb)
    _updates_whole_tensors = True  # the trust ratio's norms are over the whole tensor
    __init__ = _init_from_schema("lamb", positional=4)


class Lion(_EngineOptimizer):
    """Lion (Chen et al., arXiv 2302.06675): W ← W·(1 − lr·λ) − lr·sign(β1·m + (1−β1)·g), then
    m ← β2·m + (1−β2)·g. One state tensor, ``exp_avg`` (``state_dtype=torch.bfloat16`` stores it
    in bf16 with stochastic rounding).

    ``Lion(params, lr=1e-4, betas=(0.9, 0.99), weight_decay=0.0, *, ...)``: lion-pytorch's
    keywords and defaults; Lion wants a rate 3–10× smaller than AdamW's and a decay 3–10× larger."""

    _make_engine = staticmethod(_core.Engine.lion)
    __init__ = _init_from_schema("lion", positional=3)


class HybridOptimizer(_EngineOptimizer):
    """Muon for the hidden matrices of a model, AdamW for everything else (or the algorithm the
    configuration's ``others`` names: adam, lamb, lion), routed automatically (docs/design.md
    §Routing), with the parameter groups, clipping, schedules and QK-clip of a YAML configuration
    (docs/design.md §Configuration; docs/config.md).

    ``model_or_named_parameters``: an nn.Module or (name, tensor) pairs. ``config``: YAML text, a
    path to a .yaml/.yml file, a dict, or None for the defaults. ``total_steps``: the run's length,
    needed by schedules.

    ``process_group``: a torch.distributed group to train over, as ``muon train --nproc`` does
    (docs/distributed.md §One step on N ranks): do not wrap the model in DDP — each rank's .grad
    is its own, and step() averages the gradients (a reduce-scatter to their owners), updates
    what this rank owns, keeping its state, and all-gathers the new values; rank 0's parameters
    are copied to every rank here. state_dict() gathers every owner's state (a collective).
    A model sharded by FSDP2 (DTensor parameters) needs no process_group: each parameter's owner
    rank updates it whole, and clipping and QK-clip see every rank's gradients and logits
    (docs/distributed.md §Python: parameters sharded by FSDP2); there ``timeout`` bounds the two
    reductions of step() (norm, logits), and the gathers and scatters wait for the group's own.
    ``timeout`` (a timedelta or seconds; torch's default, 30 minutes): how long one of those
    collectives waits before step() raises a RuntimeError saying another rank exited or hung.

    param_groups: one per (configured group, algorithm, decayed or not), each with the keys
    'algorithm' ('muon', and 'adamw' or the others' algorithm) and 'group' (its configured
    name). A torch lr scheduler drives them unless the configuration has its own schedule, which
    then sets 'lr' at every step and alone: an lr changed between steps makes the next step()
    raise a RuntimeError.
    """

    def __init__(self, model_or_named_parameters, config, total_steps, process_group=None,
                 timeout=datetime.timedelta(minutes=30)):
        if isinstance(total_steps, bool) or not isinstance(total_steps, int):
            raise TypeError(f"total_steps must be an int, got {type(total_steps).__name__}")
        if not 0 < total_steps <= 2**53:
            raise ValueError(f"total_steps must be > 0 and <= 2^53, got {total_steps}")
        timeout_s = _seconds("timeout", timeout)
        named = _named_parameters(model_or_named_parameters)
        shards = None
        if any(is_sharded(p) for _, p, _ in named):
            engine, shards = sharded_hybrid(named, _config_text(config), total_steps,
                                            process_group, timeout_s)
        else:
            engine = _core.Engine.hybrid(named, _config_text(config), total_steps)
            if process_group is not None:
                check_group(process_group)
                engine.set_process_group(process_group, timeout_s)
        self._process_group = process_group
        groups = engine.groups()
        if shards is not None:  # the model's parameters in param_groups, not the engine's tensors
            parameter_of = {id(shards.engine_tensor(p)): p for p in shards.params}
            for group in groups:
                group["params"] = [parameter_of[id(t)] for t in group["params"]]
        super().__init__(groups, {}, engine=engine, shards=shards)
        # The state exists from here, zeros as the first step would make it: what reads state
        # before that step (torch.distributed.checkpoint) finds it, and takes no step of its own.
        engine.init_state()
        self._show_counters()

    def _show_counters(self):
        # Every param group carries the step counters too: torch.distributed.checkpoint keeps only
        # a state dict's state and param_groups.
        for group in self.param_groups:
            group.update(zip(_COUNTERS, self._engine.counters()))

    def _group(self):
        return self._shards.group if self._shards is not None else self._process_group

    def _owns(self, p):
        if self._shards is not None:
            return self._shards.owns(p)
        return self._process_group is None or self._engine.owns(p)

    def add_param_group(self, param_group):
        if self._engine is not None:
            raise ValueError("HybridOptimizer's parameter groups come from its configuration "
                             "(groups:); build a new optimizer to add parameters")
        super().add_param_group(param_group)

    def step(self, closure=None):
        loss = super().step(closure)
        # The configuration's schedules may have moved lr, momentum and weight decay.
        for group, settings in zip(self.param_groups, self._engine.settings()):
            for key in ("lr", "weight_decay", "momentum"):
                if key in settings:
                    group[key] = settings[key]
        self._show_counters()
        return loss

    @property
    def step_count(self):
        """Updates applied so far (skipped steps excluded): the schedules' position."""
        return self._engine.counters()[0]

    @property
    def last_step(self):
        """What the last step() did: grad_norm, clip_factor, skipped, skipped_steps, qk_clip."""
        return self._engine.last_step()

    def report(self):
        """The routing report: one dict per parameter (name, shape, dtype, role, algorithm, reason,
        group, lr, weight_decay); role is routing's side ('muon' or 'adamw'), algorithm what
        updates it ('lion' under others: lion); frozen parameters have role 'frozen' and
        algorithm and group None."""
        return self._engine.report()

    def report_text(self):
        """The routing report as an aligned text table."""
        return self._engine.report_text()

    def reset_state(self):
        """Clears momentum and moments (e.g. after an outer synchronization, DiLoCo style): they
        start again from zeros."""
        self._engine.reset_state()
        self._engine.init_state()

    def set_qk_clip_source(self, source):
        """Enables QK-clip (optimizer: muonclip) for a model: ``source`` has qk_clip_targets() ->
        list of dicts (layer, q_weight, k_weight, n_heads, n_kv_heads, head_dim, and optionally
        kind='latent', gated_query, qk_norm, qk_nope_head_dim, qk_rope_head_dim, v_head_dim) and
        qk_max_logits() -> {layer: tensor of per-head max logits}. None detaches it. On FSDP2's
        shards: the weights are the model's DTensors and the logits this rank's."""
        if source is not None and self._shards is not None:
            source = HeldQkClipSource(source, self._shards)
        self._engine.set_qk_clip_source(source)

    def state_dict(self):
        out = super().state_dict()
        step_count, skipped = self._engine.counters()
        out["counters"] = {"step_count": step_count, "skipped_steps": skipped}
        return out

    def _check_extra(self, state_dict):
        _saved_counters(state_dict)

    def _load_extra(self, state_dict):
        self._engine.restore_counters(*_saved_counters(state_dict))
        self._show_counters()


_COUNTERS = ("step_count", "skipped_steps")


def _saved_counters(state_dict):
    """(step_count, skipped_steps) of a HybridOptimizer state dict: its 'counters', or where a
    layout kept only state and param_groups (torch.distributed.checkpoint's), those its param
    groups carry, the same in each."""
    counters = state_dict.get("counters")
    if counters is None:
        in_groups = {tuple(group.get(k) for k in _COUNTERS) for group in state_dict["param_groups"]}
        counters = dict(zip(_COUNTERS, in_groups.pop())) if len(in_groups) == 1 else None
    if not isinstance(counters, dict) or not all(
            isinstance(counters.get(k), int) and counters[k] >= 0 for k in _COUNTERS):
        raise ValueError("state_dict['counters'] must be {'step_count': int >= 0, "
                         "'skipped_steps': int >= 0}, or without it every param group must hold "
                         "the same step_count and skipped_steps (HybridOptimizer.state_dict() "
                         "writes both)")
    return counters["step_count"], counters["skipped_steps"]


def build_optimizer(model_or_named_parameters, config, total_steps, process_group=None,
                    timeout=datetime.timedelta(minutes=30)):
    """The HybridOptimizer a YAML configuration (text, path or dict) describes; see
    HybridOptimizer."""
    return HybridOptimizer(model_or_named_parameters, config, total_steps, process_group, timeout)


def _seconds(name, value):
    """A positive duration in seconds from a timedelta or a number."""
    seconds = value.total_seconds() if isinstance(value, datetime.timedelta) else value
    if isinstance(seconds, bool) or not isinstance(seconds, (int, float)):
        raise TypeError(f"{name} must be a datetime.timedelta or a number of seconds, got "
                        f"{type(value).__name__}")
    if not 0 < seconds < float("inf"):
        raise ValueError(f"{name} must be > 0 seconds, got {seconds}")
    return float(seconds)


def _named_parameters(source):
    """[(name, tensor, owning module's type name)] in registration order, as routing reads them."""
    if isinstance(source, torch.nn.Module):
        out = []
        for prefix, module in source.named_modules():
            for name, p in module.named_parameters(recurse=False):
                out.append((f"{prefix}.{name}" if prefix else name, p, type(module).__name__))
        return out
    if isinstance(source, torch.Tensor) or not hasattr(source, "__iter__"):
        raise TypeError("expected an nn.Module or (name, tensor) pairs, got "
                        f"{type(source).__name__}")
    out = []
    for item in source:
        if not (isinstance(item, (tuple, list)) and len(item) == 2 and isinstance(item[0], str)
                and isinstance(item[1], torch.Tensor)):
            raise TypeError(f"named parameters must be (str, Tensor) pairs, got {item!r:.80}")
        out.append((item[0], item[1], ""))
    return out


def _config_text(config):
    """YAML text from text, a .yaml/.yml path, a dict (JSON is YAML) or None (the defaults)."""
    if config is None:
        return "{}"
    if isinstance(config, dict):
        return json.dumps(config)
    if isinstance(config, os.PathLike) or (
            isinstance(config, str) and "\n" not in config
            and config.strip().endswith((".yaml", ".yml"))):
        with open(config, encoding="utf-8") as f:
            return f.read()
    if isinstance(config, str):
        return config
    raise TypeError("config must be YAML text, a path, a dict or None, got "
                    f"{type(config).__name__}")


def orthogonalize(x, coefficients="quintic", steps=5, *, method="automatic", dtype=None,
                  gram_restarts=None):
    """Newton–Schulz orthogonalization (docs/design.md §Newton–Schulz orthogonalization) of each
    matrix in the last two dims of ``x``: approximately U·Vᵀ of its SVD. ``x`` is not modified.
    ``coefficients``: a table's name ({tables}) or rows [[a, b, c], ...]; ``method``:
    'automatic', 'plain', 'symmetric', 'gram'; ``dtype``: the working dtype (default float32 on
    CPU, float64 stays float64); ``gram_restarts``: the iteration counts after which 'gram' forms
    W and its Gram matrix afresh (strictly increasing, each >= 1; () for never; None: the table's
    default, every 2 at most in bfloat16)."""
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"x must be a torch.Tensor, got {type(x).__name__}")
    if isinstance(steps, bool) or not isinstance(steps, int):
        raise TypeError(f"steps must be an int, got {type(steps).__name__}")
    return _core.orthogonalize(x, coefficients, steps, method, dtype, gram_restarts)


orthogonalize.__doc__ = orthogonalize.__doc__.replace("{tables}", _core.coefficient_table_names())


def orthogonality_error(x):
    """max over the batch of ‖G − I‖_F / √k, G the k×k Gram matrix on the smaller side (0 for
    an exactly orthogonal result)."""
    return _core.orthogonality_error(x)
