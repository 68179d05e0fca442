"""The base of every optimizer here: a torch.optim.Optimizer whose parameters, settings and state
live in a C++ engine (muon_cpp._core.Engine), with PyTorch's state_dict layout."""

import collections.abc

import torch
from torch.optim import Optimizer

from ._distributed import OwnerPlan, gather_state
from ._sharded import ShardedParams, is_sharded


class _EngineOptimizer(Optimizer):
    """A torch.optim.Optimizer whose parameters, settings and state live in a C++ engine.

    The Python param_groups are the source of truth for settings: step() pushes them into the
    engine first. The engine is the source of truth for state; ``state`` is a view of it.
    """

    _make_engine = None  # _core.Engine.<algorithm>, set by each subclass
    _updates_matrices = False  # Muon and Dion: parameters are owned by orthogonalization cost
    _updates_whole_tensors = False  # Muon, Dion, Lamb: a shard alone cannot be updated

    def __init__(self, params, defaults, engine=None, process_group=None, shards=None):
        self._engine = None
        self._plan = None
        self._shards = shards  # the engine's tensors for sharded parameters, if made already
        super().__init__(params, defaults)
        if shards is None and any(is_sharded(p) for p in self._params()):
            self._shards = ShardedParams(self._params(), self._updates_whole_tensors,
                                         self._updates_matrices, process_group,
                                         type(self).__name__)
        elif process_group is not None:
            self._plan = OwnerPlan(self._params(), self._updates_matrices, process_group)
        self._engine = engine if engine is not None else self._new_engine()

    def _new_engine(self):
        return self._make_engine(
            [([self._engine_param(p) for p in group["params"]], self._engine_settings(group))
             for group in self.param_groups])

    @property
    def state(self):
        """Per-parameter state, keyed by parameter as in torch.optim: the engine's live tensors
        (momentum, moments) and the step count as a float tensor (a copy)."""
        return _StateView(self)

    @state.setter
    def state(self, value):
        # torch.optim.Optimizer.__init__ assigns an empty dict; the state itself lives in C++.
        if value:
            raise TypeError(f"{type(self).__name__} keeps its state in C++; "
                            "use load_state_dict() to replace it")

    def add_param_group(self, param_group):
        if isinstance(param_group, dict):
            param_group = self._from_torch_names(_named(dict(param_group), self.param_groups))
        if self._engine is not None and (self._plan is not None or self._shards is not None):
            raise ValueError(f"{type(self).__name__}: with a process_group or sharded (DTensor) "
                             "parameters, give every parameter group to the constructor: who "
                             "updates what is planned over all of them at once")
        super().add_param_group(param_group)  # PyTorch's checks and defaults
        if self._engine is None:
            return
        # A new engine over all groups (which validates the new ones), keeping the state so far.
        try:
            engine = self._new_engine()
            kept = [(i, p, self._engine.state(p)) for i, p in enumerate(self._params())]
            engine.load([_settings(g) for g in self.param_groups],
                        [entry for entry in kept if entry[2] is not None])
        except Exception:
            self.param_groups.pop()
            raise
        self._engine = engine

    def step(self, closure=None):
        """Calls ``closure`` (if any) with gradients enabled, then updates every parameter that
        has a gradient. Returns the closure's loss."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:  # settings written under torch.optim's names
            self._from_torch_names(group)
        self._engine.set_options([self._engine_settings(group) for group in self.param_groups])
        if self._shards is not None:
            self._shards.step(self._params(), self._engine.step)
            return loss
        if self._plan is None:
            self._engine.step()
            return loss
        # The engine updates what has a gradient: this rank's own parameters only. It still sees
        # all of them, so that each keeps the position one process gives it (the seed of its
        # stochastic rounding and of Dion's first Q).
        others = [(p, p.grad) for p in self._params()
                  if p.grad is not None and not self._plan.owns(p)]
        try:
            for p, _ in others:
                p.grad = None
            self._engine.step()
        finally:
            for p, grad in others:
                p.grad = grad
        self._plan.share(self._params())
        return loss

    def state_dict(self):
        """PyTorch's layout: {'state': {index: {...}}, 'param_groups': [{..., 'params': [index]}]},
        parameters numbered in param_groups order. State tensors are the live buffers; with a
        process group, every owner's state gathered to every rank (a collective: call it on all
        ranks), as CPU copies — the state dict one process would have, loadable at any world
        size. With sharded (DTensor) parameters likewise: each rank's rows of the state gathered
        into whole tensors (a collective), the state dict one process would have."""
        index = {id(p): i for i, p in enumerate(self._params())}
        groups = []
        for group in self.param_groups:
            packed = {key: value for key, value in group.items() if key != "params"}
            packed["params"] = [index[id(p)] for p in group["params"]]
            groups.append(packed)
        entries = list(self.state.items())
        if self._shards is not None:
            entries = [(p, self._shards.whole_entry(p, entry)) for p, entry in entries]
        state = {index[id(p)]: entry for p, entry in entries}
        if self._group() is not None and (self._shards is None or self._shards.owners_hold_state):
            state = gather_state(state, self._group())
        return {"state": state, "param_groups": groups}

    def load_state_dict(self, state_dict):
        """Replaces settings and state with ``state_dict``'s (from this class's state_dict()).
        Everything is checked first; on any error nothing changes."""
        saved_groups, saved_state = _split_state_dict(state_dict)
        if len(saved_groups) != len(self.param_groups):
            raise ValueError(f"loaded state dict has {len(saved_groups)} parameter groups, "
                             f"this optimizer has {len(self.param_groups)}")
        by_index = {}
        for number, (ours, saved) in enumerate(zip(self.param_groups, saved_groups)):
            if len(ours["params"]) != len(saved["params"]):
                raise ValueError(f"loaded state dict's parameter group {number} has "
                                 f"{len(saved['params'])} parameters, this optimizer's has "
                                 f"{len(ours['params'])}")
            by_index.update(zip(saved["params"], ours["params"]))
        states = []
        for key, entry in saved_state.items():
            if key not in by_index:
                raise ValueError(f"loaded state dict has state for parameter {key!r}, which no "
                                 "parameter group lists")
            if not isinstance(entry, dict):
                raise TypeError(f"state_dict['state'][{key!r}] must be a dict, "
                                f"got {type(entry).__name__}")
            p = by_index[key]
            if self._owns(p):
                if self._shards is not None:
                    entry = self._shards.local_entry(p, entry)
                states.append((key, self._engine_param(p), entry))
        settings = [self._from_torch_names(self._loaded_group(
                        {key: value for key, value in saved.items() if key != "params"}))
                    for saved in saved_groups]
        self._check_extra(state_dict)
        self._engine.load([self._engine_settings(group) for group in settings], states)
        for group, saved in zip(self.param_groups, settings):
            group.update(saved)
        self._load_extra(state_dict)

    def _params(self):
        return [p for group in self.param_groups for p in group["params"]]

    # Data parallelism: the process group (None: one process) and whether this rank updates `p`
    # and keeps its state.
    def _group(self):
        if self._shards is not None:
            return self._shards.group
        return None if self._plan is None else self._plan.group

    def _owns(self, p):
        if self._shards is not None:
            return self._shards.owns(p)
        return self._plan is None or self._plan.owns(p)

    # The tensor the engine updates for the parameter `p`: `p` itself, or for a sharded one its
    # local rows or the owner's whole copy (muon_cpp._sharded).
    def _engine_param(self, p):
        return p if self._shards is None else self._shards.engine_tensor(p)

    # A settings dict as param_groups keep it, from one written with torch.optim's names (a
    # subclass's aliases, its implementation flags): rewritten in place; returns the dict.
    # Implementation flags of this class's peers beyond torch.optim's common ones (AMSGRAD, ...).
    _own_torch_flags = {}

    def _from_torch_names(self, settings):
        check_torch_flags(settings, type(self).__name__, self._own_torch_flags)
        return settings

    # What the engine gets for a param group: its settings under the engine's names (the engine
    # ignores keys it does not know, such as param_names).
    def _engine_settings(self, group):
        return _settings(group)

    # A param group of a loaded state dict, before _from_torch_names; a subclass whose state
    # dicts carry more than one name for a setting reconciles them here.
    def _loaded_group(self, saved):
        return saved

    # Hooks for what a subclass saves beyond PyTorch's layout.
    def _check_extra(self, state_dict):
        pass

    def _load_extra(self, state_dict):
        pass


class _StateView(collections.abc.Mapping):
    """optimizer.state: parameter → {'step': tensor, name: tensor}, read from the engine on each
    lookup (parameters without state yet are absent)."""

    def __init__(self, optimizer):
        self._optimizer = optimizer

    def _entry(self, p):
        engine = self._optimizer.__dict__.get("_engine")
        entry = engine.state(self._optimizer._engine_param(p)) if engine is not None else None
        if entry is not None:
            entry["step"] = torch.tensor(float(entry["step"]))
        return entry

    def __getitem__(self, p):
        entry = self._entry(p) if isinstance(p, torch.Tensor) else None
        if entry is None:
            raise KeyError(p)
        return entry

    def __iter__(self):
        return (p for p in self._optimizer._params() if self._entry(p) is not None)

    def __len__(self):
        return sum(1 for _ in self)

    def __repr__(self):
        return repr(dict(self.items()))


def _settings(group):
    """A param group's settings for the engine (it ignores keys it does not know)."""
    return {key: value for key, value in group.items() if key != "params"}


def _named(param_group, groups):
    """A param group whose params are (name, tensor) pairs, as named_parameters() gives them,
    split into params and param_names as torch.optim (2.x) does it — here on every PyTorch."""
    params = param_group.get("params")
    if isinstance(params, (torch.Tensor, set)) or params is None:
        return param_group  # PyTorch's own checks and messages
    params = list(params)
    named = [isinstance(p, tuple) for p in params]
    if any(named):
        if not all(named) or not all(len(p) == 2 and isinstance(p[0], str) for p in params):
            raise ValueError("all optimizer params should be with/without names: give tensors or "
                             "(name, tensor) pairs, as named_parameters() does, not both")
        param_group["param_names"] = [name for name, _ in params]
        params = [p for _, p in params]
    for group in groups:
        if ("param_names" in group) != ("param_names" in param_group):
            raise ValueError("all optimizer param groups should be with/without names: cannot add "
                             f"a group {'with' if 'param_names' in param_group else 'without'} "
                             "names to groups " + ("with" if "param_names" in group else "without"))
    param_group["params"] = params
    return param_group


def _split_state_dict(state_dict):
    if not isinstance(state_dict, dict):
        raise TypeError(f"state_dict must be a dict, got {type(state_dict).__name__}")
    for key in ("state", "param_groups"):
        if key not in state_dict:
            raise ValueError(f"state_dict lacks '{key}'; expected the result of state_dict()")
    groups, state = state_dict["param_groups"], state_dict["state"]
    if not isinstance(groups, list) or not all(isinstance(g, dict) and "params" in g
                                               for g in groups):
        raise TypeError("state_dict['param_groups'] must be a list of dicts with 'params'")
    if not isinstance(state, dict):
        raise TypeError(f"state_dict['state'] must be a dict, got {type(state).__name__}")
    return groups, state


# torch.optim's keywords that pick among its implementations (PyTorch 2.x). muon-cpp has one
# implementation per device, so `foreach` is accepted and changes nothing; the others are accepted
# at the value that means "off" (torch's default), and refused otherwise, saying why.
TORCH_IMPLEMENTATION_FLAGS = ("foreach", "maximize", "capturable", "differentiable")
_WHY_NOT = {
    "maximize": "negate the loss instead",
    "capturable": "muon-cpp's steps read their scalars on the host, so a CUDA graph cannot "
                  "capture them",
    "differentiable": "muon-cpp's updates run outside autograd",
}
# Flags of one optimizer class's peers, name → why True is refused (None: any bool is accepted,
# the arithmetic being the same).
AMSGRAD = {"amsgrad": "AMSGrad's running maximum of the second moment is not implemented"}
USE_ADDMM = {"use_addmm": None}  # an older torch.optim.Muon's choice of addmm for a·X + B·X


def check_torch_flags(settings, who, own_flags=None):
    """Checks and removes torch.optim's implementation flags, and the class's ``own_flags``, from
    ``settings`` (in place)."""
    why_not = dict(_WHY_NOT, **(own_flags or {}))
    for name in TORCH_IMPLEMENTATION_FLAGS + tuple(own_flags or ()):
        if name not in settings:
            continue
        value = settings.pop(name)
        if value is None and name not in _WHY_NOT:  # foreach's default; "not given" otherwise
            continue
        if not isinstance(value, bool):
            raise TypeError(f"{name} must be a bool{' or None' if name not in _WHY_NOT else ''}, "
                            f"got {type(value).__name__}")
        if value and why_not.get(name):
            raise ValueError(f"{who}: {name}=True is not supported; {why_not[name]}")
