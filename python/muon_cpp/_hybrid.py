"""muon_cpp.HybridOptimizer: Muon for the matrices routing picks, AdamW (or the configured others)
for the rest, under a YAML configuration — built from a model, named parameters, plain tensors or
param groups, with the configuration's keys also taken as keyword arguments.

Over 400 lines on purpose: the class and build_optimizer share every way in (model, named
parameters, tensors, groups, example inputs traced to the output layer) and read as one piece."""

import dataclasses
import datetime
import inspect
import json
import os
import warnings

import torch

from . import _core
from ._distributed import check_group
from ._engine import _EngineOptimizer, _Pushed, _check_disjoint, _param_list, check_group_keys
from ._sharded import HeldQkClipSource, is_sharded, sharded_hybrid

# The keys of a configuration's optimizer section (docs/config.md), which HybridOptimizer also
# takes as keyword arguments: the C++ reader's own list.
OPTIMIZER_KEYS = tuple(_core.optimizer_keys())

# A param group's keys that HybridOptimizer reads (a configuration's param_groups entry's settings).
_GROUP_KEYS = tuple(key for key, *_ in _core.config_schema("param_group")
                    if key not in ("name", "patterns"))
_COUNTERS = ("step_count", "skipped_steps")


class HybridOptimizer(_EngineOptimizer):
    """Muon for the hidden matrices of a model, AdamW for everything else (or the algorithm the
    configuration's ``others`` names: adam, lamb, lion), routed automatically (docs/design.md
    §Routing), with the parameter groups, clipping, schedules and QK-clip of a YAML configuration
    (docs/design.md §Configuration; docs/config.md).

    ``params``: an nn.Module (routing reads names and module types), (name, tensor) pairs as
    named_parameters() gives them (names), plain tensors (``model.parameters()``: routed by
    shape — rank-2 matrices to Muon, the rest to the others), or param groups as torch.optim takes
    them (dicts with 'params', tensors or (name, tensor) pairs, and any of a configuration group's
    settings: lr, lr_multiplier, weight_decay, betas, eps, momentum, num_heads, split_sizes,
    schedule), each group's parameters routed within it and keeping its settings — the form
    HF Trainer's ``optimizer_cls_and_kwargs`` and config-driven builders call. Rank-2 tensors
    given without names and routed by shape make one UserWarning per build (an embedding or output
    head among them goes to Muon); ``routing="shape"`` routes by shape knowingly, without it.

    ``config``: YAML text, a path to a .yaml/.yml file, a dict, or None for the defaults; the
    keyword arguments (``lr=0.02, adamw_lr=3e-4, others="lion", grad_clip=1.0``, any key of its
    optimizer section) are merged into it (a key given both ways is an error). ``total_steps``:
    the run's length, needed by schedules only.

    ``process_group``: a torch.distributed group to train over, as ``muon train --nproc`` does
    (docs/distributed.md §One step on N ranks): do not wrap the model in DDP — each rank's .grad
    is its own, and step() averages the gradients (a reduce-scatter to their owners), updates
    what this rank owns, keeping its state, and all-gathers the new values; rank 0's parameters
    are copied to every rank here. state_dict() gathers every owner's state (a collective).
    A model sharded by FSDP2 (DTensor parameters) needs no process_group: each parameter's owner
    rank updates it whole, and clipping and QK-clip see every rank's gradients and logits
    (docs/distributed.md §Python: parameters sharded by FSDP2); there ``timeout`` bounds the two
    reductions of step() (norm, logits), and the gathers and scatters wait for the group's own.
    Parameters swapped for FSDP2's DTensors after construction (accelerate's prepare) are sharded
    so at the next step. ``timeout`` (a timedelta or seconds; torch's default, 30 minutes): how
    long one of those collectives waits before step() raises a RuntimeError saying another rank
    exited or hung.

    ``example_inputs``: with a model, inputs for one forward pass (a tensor, a tuple of positional
    arguments or a dict of keyword arguments) run before routing, in eval mode (the modes
    restored after; no backward pass, no weight or buffer changes): the module nearest the
    model's output in its autograd graph, among those owning a matrix, is its output layer, and
    its matrices go to AdamW as such (routing.outputs) instead of by name or by guess. Routing warns (a UserWarning) when a role
    rests on a name or a guess (docs/python.md, example_inputs=, says how to settle each).

    param_groups: one per (configured group, algorithm, decayed or not), each with the keys
    'algorithm' ('muon', and 'adamw' or the others' algorithm) and 'group' (its configured
    name). A torch lr scheduler drives them unless the configuration has its own schedule, which
    then sets 'lr' at every step and alone: an lr changed between steps makes the next step()
    raise a RuntimeError. A tensor swapped into a group takes the place of the one it replaces
    (its name and routing); one appended is trained by the group's algorithm.
    """

    def __init__(self, params, config=None, total_steps=None, process_group=None,
                 timeout=datetime.timedelta(minutes=30), example_inputs=None, **options):
        total_steps = _total_steps(total_steps)
        timeout_s = _seconds("timeout", timeout)
        named, keys = _parameters(params)
        for key, value in options.items():
            if key not in OPTIMIZER_KEYS:
                raise TypeError(f"HybridOptimizer got an unexpected keyword argument {key!r}; "
                                "its keywords are the configuration's optimizer keys: "
                                + ", ".join(OPTIMIZER_KEYS))
            if key == "routing":
                value = _routing(value, keys.get("routing"))
            if value is not None:
                keys[key] = value
        if example_inputs is not None:
            routing = dict(keys.get("routing") or {})
            routing["outputs"] = list(routing.get("outputs", [])) + _traced_outputs(
                params, example_inputs)
            keys["routing"] = routing
        text = _config_text(config)
        if keys:
            text = _core.with_optimizer_keys(text, json.dumps(keys))
        shards = None
        if any(is_sharded(p) for _, p, _ in named):
            engine, shards = sharded_hybrid(named, text, total_steps, process_group, timeout_s)
        else:
            engine = _core.Engine.hybrid(named, text, total_steps)
            if process_group is not None:
                check_group(process_group)
                engine.set_process_group(process_group, timeout_s)
        self._recipe = (named, text, total_steps, timeout_s)
        self._qk_source = None
        super().__init__(_model_groups(engine, shards), {}, engine=engine,
                         process_group=process_group, shards=shards)
        # The state exists from here, zeros as the first step would make it: what reads state
        # before that step (torch.distributed.checkpoint) finds it, and takes no step of its own.
        engine.init_state()
        self._show_counters()
        if not _shape_routing_chosen(options.get("routing")):
            _warn_routed_by_shape(self.report())

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

    def _from_torch_names(self, settings):
        check_group_keys(settings, "HybridOptimizer", settings.get("algorithm"))
        return super()._from_torch_names(settings)

    def add_param_group(self, param_group):
        if self._engine is not None:
            raise ValueError("HybridOptimizer's parameter groups come from its configuration "
                             "(param_groups:); put tensors into an existing group's 'params' "
                             "(trained by that group's algorithm), or build a new optimizer")
        super().add_param_group(param_group)

    def _rebind(self):
        """The groups' tensors as they are now: swapped, appended or removed within the groups
        the configuration made (the C++ hybrid's replace_params), or every trainable tensor
        swapped for FSDP2's DTensor of it (accelerate's prepare): sharded from here on."""
        if len(self.param_groups) != len(self._bound):
            raise ValueError(f"param_groups has {len(self.param_groups)} groups, the "
                             f"configuration made {len(self._bound)}; HybridOptimizer's groups "
                             "come from its configuration: put tensors into their 'params'")
        for number, group in enumerate(self.param_groups):
            group["params"] = _param_list(group["params"], number)
        _check_disjoint(self.param_groups)
        replaced = self._replacements()
        if self._shards is None and any(is_sharded(p) for p in self._params()):
            self._shard(replaced)
        else:  # checked under the groups' settings as they are now (fused, say)
            self._engine.set_options([self._engine_settings(group) for group in self.param_groups])
            self._engine.replace_params([group["params"] for group in self.param_groups])
            named, text, total_steps, timeout_s = self._recipe
            trainable = {id(p) for p in self._params()}
            held = {id(p) for p in self._bound_params()}
            named = [(name, replaced.get(id(p), p), kind) for name, p, kind in named
                     if id(replaced.get(id(p), p)) in trainable or id(p) not in held]
            self._recipe = (named, text, total_steps, timeout_s)
        self._bound = self._param_lists()

    def _replacements(self):
        """{id(old tensor): new tensor} for each tensor that left its group and whose index a new
        one took: the new one stands in for it (its name, routing and place)."""
        now = {id(p) for p in self._params()}
        out = {}
        for group, (held, _) in zip(self.param_groups, self._bound):
            for old, new in zip(held, group["params"]):
                if new is not old and id(old) not in now:
                    out[id(old)] = new
        return out

    def _shard(self, replaced):
        named, text, total_steps, timeout_s = self._recipe
        for index, p in enumerate(self._bound_params()):
            new = replaced.get(id(p))
            if new is None or not is_sharded(new) or new.shape != p.shape:
                raise ValueError("some parameters are now FSDP2's DTensors; the others must be "
                                 "too, each in the place of the tensor it shards (same group, "
                                 f"index and shape): parameter {index} of param_groups is not")
        settings = [self._engine_settings(group) for group in self.param_groups]
        counters = self._engine.counters()
        named = [(name, replaced.get(id(p), p), kind) for name, p, kind in named]
        engine, shards = sharded_hybrid(named, text, total_steps, self._process_group, timeout_s)
        groups = _model_groups(engine, shards)
        if [[id(p) for p in g["params"]] for g in groups] != \
                [[id(p) for p in g["params"]] for g in self.param_groups]:
            raise ValueError("the DTensors routed into other groups than the tensors they "
                             "shard; build the optimizer after fully_shard")
        engine.set_options(settings)
        engine.restore_counters(*counters)
        engine.init_state()
        self._engine, self._shards = engine, shards
        self._recipe = (named, text, total_steps, timeout_s)
        if self._qk_source is not None:
            self.set_qk_clip_source(self._qk_source)

    def _end_step(self):
        # The configuration's schedules may have moved lr, momentum and weight decay.
        for group, settings in zip(self.param_groups, self._engine.settings()):
            for key in ("lr", "weight_decay", "momentum"):
                if key in settings:
                    group[key] = settings[key]
        self._show_counters()
        self._pushed, self._ending = _Pushed(self._engine, self.param_groups), None

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
        group, lr, weight_decay); role is the hybrid's slot routing chose ('matrices' or
        'others'; 'muon' and 'adamw' before the slots), algorithm what
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
        self._qk_source = source  # set again on an engine rebuilt over sharded parameters
        if source is not None and self._shards is not None:
            source = HeldQkClipSource(source, self._shards)
        self._engine.set_qk_clip_source(source)

    def _state_dict(self):
        out = super()._state_dict()
        step_count, skipped = self._engine.counters()
        out["counters"] = {"step_count": step_count, "skipped_steps": skipped}
        return out

    def _check_extra(self, state_dict):
        _saved_counters(state_dict)

    def _load_extra(self, state_dict):
        self._engine.restore_counters(*_saved_counters(state_dict))
        self._show_counters()

    # A copy (copy.deepcopy, pickle) rebuilds the engine from the routing and configuration it
    # was built with, with the groups' tensors and the step counters; settings and state follow.
    def _copied_extra(self):
        return {"recipe": self._recipe, "counters": self._engine.counters()}

    def _copied_engine(self, extra):
        named, text, total_steps, _ = self._recipe = extra["recipe"]
        self._qk_source = None  # the model's; the copy's is set by set_qk_clip_source again
        engine = _core.Engine.hybrid(named, text, total_steps)
        engine.replace_params([group["params"] for group in self.param_groups])
        engine.restore_counters(*extra["counters"])
        return engine


_SIGNATURE = inspect.signature(HybridOptimizer.__init__)
HybridOptimizer.__init__.__signature__ = _SIGNATURE.replace(parameters=[
    *[p for p in _SIGNATURE.parameters.values() if p.kind != inspect.Parameter.VAR_KEYWORD],
    *[inspect.Parameter(key, inspect.Parameter.KEYWORD_ONLY, default=None)
      for key in OPTIMIZER_KEYS]])


def _model_groups(engine, shards):
    """The engine's param groups with the model's parameters in them (for FSDP2's shards the
    engine holds other tensors in their place)."""
    groups = engine.groups()
    if shards is not None:
        parameter_of = {id(shards.engine_tensor(p)): p for p in shards.params}
        for group in groups:
            group["params"] = [parameter_of[id(t)] for t in group["params"]]
    return groups


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


def build_optimizer(params, config=None, total_steps=None, process_group=None,
                    timeout=datetime.timedelta(minutes=30), example_inputs=None, **options):
    """The HybridOptimizer a YAML configuration (text, path or dict) describes; see
    HybridOptimizer."""
    return HybridOptimizer(params, config, total_steps, process_group, timeout, example_inputs,
                           **options)


def _tensors(value):
    """The tensors in a module's output: a tensor, or tuples, lists, dicts (HF's ModelOutput)
    and dataclasses of them."""
    if isinstance(value, torch.Tensor):
        yield value
    elif isinstance(value, dict):
        for item in value.values():
            yield from _tensors(item)
    elif isinstance(value, (tuple, list)):
        for item in value:
            yield from _tensors(item)
    elif dataclasses.is_dataclass(value) and not isinstance(value, type):
        for field in dataclasses.fields(value):
            yield from _tensors(getattr(value, field.name))


def _traced_outputs(model, example_inputs):
    """Names of the matrices of the model's output layer: the module nearest the model's output
    — its first tensor (HF's ModelOutput: the loss, or the logits) — among those that own a
    matrix, found by one forward pass on ``example_inputs`` (see HybridOptimizer) and a walk back
    through its autograd graph (nothing is computed backwards)."""
    if not isinstance(model, torch.nn.Module):
        raise TypeError("example_inputs= traces a model: give the nn.Module itself as params, "
                        f"not {type(model).__name__}")
    if isinstance(example_inputs, dict):
        args, kwargs = (), example_inputs
    elif isinstance(example_inputs, (tuple, list)):
        args, kwargs = tuple(example_inputs), {}
    else:
        args, kwargs = (example_inputs,), {}
    owners = {name: [f"{name}.{p_name}" for p_name, p in m.named_parameters(recurse=False)
                     if p.dim() >= 2 and p.requires_grad]
              for name, m in model.named_modules() if name}
    produced = {}  # an output's autograd node → the module that returned it, innermost first

    def hook(name):
        def record(_module, _inputs, output):
            for t in _tensors(output):
                if t.grad_fn is not None:
                    produced.setdefault(t.grad_fn, name)
        return record

    handles = [m.register_forward_hook(hook(name)) for name, m in model.named_modules()
               if owners.get(name)]
    modes = [(m, m.training) for m in model.modules()]
    try:
        model.eval()
        with torch.enable_grad():
            output = model(*args, **kwargs)
            first = next(_tensors(output), None)
            layer = _nearest(first.grad_fn if first is not None else None, produced)
    finally:
        for handle in handles:
            handle.remove()
        for module, training in modes:
            module.training = training
    return owners[layer] if layer is not None else []


def _nearest(node, produced):
    """The module of ``produced`` whose output is nearest ``node`` in its autograd graph."""
    queue, seen = [node] if node is not None else [], set()
    while queue:
        node = queue.pop(0)
        if node in produced:
            return produced[node]
        for child, _ in node.next_functions:
            if child is not None and child not in seen:
                seen.add(child)
                queue.append(child)
    return None


def _total_steps(total_steps):
    """The run's length for the engine: 0 for None (unknown: a configuration without schedules)."""
    if total_steps is None:
        return 0
    if isinstance(total_steps, bool) or not isinstance(total_steps, int):
        raise TypeError(f"total_steps must be an int or None, got {type(total_steps).__name__}")
    if not 0 < total_steps <= 2**53:
        raise ValueError(f"total_steps must be > 0 and <= 2^53 (or None when unknown, without "
                         f"schedules), got {total_steps}")
    return total_steps


def _seconds(name, value):
    """A positive duration in seconds from a timedelta or a number."""
    seconds = value.total_seconds() if isinstance(value, datetime.timedelta) else value
    if isinstance(seconds, bool) or not isinstance(seconds, (int, float)):
        raise TypeError(f"{name} must be a datetime.timedelta or a number of seconds, got "
                        f"{type(value).__name__}")
    if not 0 < seconds < float("inf"):
        raise ValueError(f"{name} must be > 0 seconds, got {seconds}")
    return float(seconds)


_FORMS = ("an nn.Module, parameters (tensors, or (name, tensor) pairs as named_parameters() "
          "gives them) or param groups (dicts with 'params')")


def _parameters(source):
    """([(name, tensor, owning module's type name)] in order, as routing reads them; the
    configuration keys the form implies): a module's names and types; pairs' names; plain
    tensors named by position (param_groups.<group>.<index>) and routed by shape; each param
    group a configured group of its own, with its settings."""
    if isinstance(source, torch.nn.Module):
        out = []
        for prefix, module in source.named_modules():
            for name, p in module.named_parameters(recurse=False):
                out.append((f"{prefix}.{name}" if prefix else name, p, type(module).__name__))
        return out, {}
    if isinstance(source, torch.Tensor) or not hasattr(source, "__iter__"):
        raise TypeError(f"HybridOptimizer takes {_FORMS}, got {type(source).__name__}")
    items = list(source)
    if not items:
        raise ValueError("HybridOptimizer got an empty parameter list")
    if all(isinstance(item, dict) for item in items):
        return _groups(items)
    if any(isinstance(item, dict) for item in items):
        raise TypeError(f"HybridOptimizer takes {_FORMS}: give param groups (dicts) alone, not "
                        "beside tensors")
    named, by_name = _named_tensors(items, 0)
    return named, ({} if by_name else {"routing": {"names": False}})


def _named_tensors(items, number):
    """[(name, tensor, '')] of one group's tensors or (name, tensor) pairs, and whether named."""
    pairs = [isinstance(item, (tuple, list)) and len(item) == 2 and isinstance(item[0], str)
             for item in items]
    if any(pairs) and not all(pairs):
        raise ValueError(f"param group {number}: give tensors or (name, tensor) pairs, as "
                         "named_parameters() does, not both")
    named = []
    for index, item in enumerate(items):
        name, tensor = item if pairs[index] else (f"param_groups.{number}.{index}", item)
        if not isinstance(tensor, torch.Tensor):
            what = "(name, tensor) pairs" if all(pairs) else "tensors"
            raise TypeError(f"HybridOptimizer takes {_FORMS}; parameter {index} of param group "
                            f"{number} is a {type(tensor).__name__} among {what}")
        named.append((name, tensor, ""))
    return named, bool(items) and all(pairs)


def _groups(groups):
    """Param groups as a configuration's: each its own group of exactly its tensors' names."""
    named, specs, by_name, tensors = [], [], True, []
    for number, group in enumerate(groups):
        if "params" not in group:
            raise ValueError(f"param group {number} has no 'params'")
        params = group["params"]
        items = [params] if isinstance(params, torch.Tensor) else list(params)
        unknown = sorted(set(group) - set(_GROUP_KEYS) - {"params"})
        if unknown:
            raise ValueError(f"param group {number} has {unknown[0]!r}, which HybridOptimizer's "
                             f"groups do not take; they take {', '.join(_GROUP_KEYS)} (the "
                             "settings of a configuration's param_groups entry)")
        group_named, group_by_name = _named_tensors(items, number)
        tensors.append({"params": [p for _, p, _ in group_named]})
        if not items:
            continue  # nothing to train (HF's no-decay group of a model without biases)
        by_name = by_name and group_by_name
        named += group_named
        specs.append({"name": f"param_groups.{number}",
                      "patterns": [_literal(name) for name, _, _ in group_named],
                      **{key: value for key, value in group.items() if key != "params"}})
    _check_disjoint(tensors)
    return named, {"param_groups": specs, **({} if by_name else {"routing": {"names": False}})}


def _routing(value, implied):
    """The routing section the keyword ``routing`` gives — 'shape' (rank and dtype alone, names
    read by no rule) or a dict of the section's keys — over the one the form of params implies
    (names: false for tensors given without names): patterns given for such tensors must not
    turn name rules on over their positional names."""
    if isinstance(value, str):
        if value != "shape":
            raise ValueError(f"routing must be 'shape' (route by rank and dtype alone) or a dict "
                             f"of the configuration's routing keys ({_ROUTING_KEYS}), got "
                             f"{value!r}")
        value = {"names": False}
    if isinstance(value, dict) and implied:
        return {**implied, **value}
    return value


_ROUTING_KEYS = "muon, adamw, higher_rank, split_heads, names, outputs"


def _shape_routing_chosen(routing):
    """Whether the caller asked for routing by shape: then there is no surprise to warn of."""
    return routing == "shape" or (isinstance(routing, dict) and routing.get("names") is False)


def _warn_routed_by_shape(report):
    """One warning per build for the matrices that went to the matrices' algorithm by shape alone
    (given without names): an embedding or an output head among them is trained as a hidden
    matrix, and nothing else would tell."""
    by_shape = [row["algorithm"] for row in report if "routed by shape" in row["reason"]]
    if not by_shape:
        return
    count = len(by_shape)
    warnings.warn(
        f"routing: {count} rank-2 tensor{'s' if count > 1 else ''} given without names went to "
        f"{by_shape[0].capitalize()} by shape alone, and shape cannot tell an embedding or an "
        "output head from a hidden matrix. To route by names and module types, pass the model "
        "itself or model.named_parameters() (HF Trainer's optimizer_cls_and_kwargs: add "
        "\"model\": model to its kwargs); to route by shape knowingly, pass routing=\"shape\"",
        UserWarning, stacklevel=_caller_level())


_PACKAGE = os.path.dirname(os.path.abspath(__file__))


def _caller_level():
    """The stacklevel, for its caller's warnings.warn, of the first frame outside muon_cpp: the
    warning names the user's line (build_optimizer's call, HF's Trainer), not ours."""
    level, frame = 1, inspect.currentframe().f_back
    while frame is not None and \
            os.path.dirname(os.path.abspath(frame.f_code.co_filename)) == _PACKAGE:
        level, frame = level + 1, frame.f_back
    return level


def _literal(name):
    """An fnmatch pattern matching exactly ``name``."""
    return "".join(f"[{c}]" if c in "*?[" else c for c in name)


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
