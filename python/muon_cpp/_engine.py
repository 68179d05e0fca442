"""The base of every optimizer here: a torch.optim.Optimizer whose parameters, settings and state
live in a C++ engine (muon_cpp._core.Engine), with PyTorch's state_dict layout.

Over 400 lines on purpose: the whole torch.optim.Optimizer contract (param_groups read at every
step, state dicts and their hooks, copies, process groups) is one base class that every optimizer
shares; its parts call each other throughout."""

import collections.abc
import logging
import operator

import torch
from torch.optim import Optimizer

from . import _core
from ._distributed import OwnerPlan, gather_state
from ._schema import check_torch_flags, init_from_schema
from ._sharded import ShardedParams, is_sharded


class _EngineOptimizer(Optimizer):
    """A torch.optim.Optimizer whose parameters, settings and state live in a C++ engine.

    The Python param_groups are the source of truth for settings and parameters, as in torch.optim:
    step() pushes every group's settings into the engine first, and when the groups' tensors have
    changed since the engine last read them (a tensor swapped into a group, appended or removed;
    a group added or dropped), it rebuilds the engine over them first, keeping the state of every
    tensor that stays (a new one starts afresh). The engine is the source of truth for state;
    ``state`` is a view of it.
    """

    _make_engine = None  # _core.Engine.<algorithm>, set by each subclass
    _algorithm = None  # the registry's name of what this class runs on every group (None: several)
    _updates_matrices = False  # Muon and Dion: parameters are owned by orthogonalization cost
    _updates_whole_tensors = False  # Muon, Dion, Lamb: a shard alone cannot be updated

    def __init_subclass__(cls, algorithm=None, **schema):
        """A class that runs one registered algorithm names it in its first line,
        ``class Lion(_EngineOptimizer, algorithm="lion", positional=3)``: its engine, its name
        and (unless it writes its own) an __init__ from the C++ option schema follow;
        ``schema`` are _schema.init_from_schema's keywords (``positional``, ``aliases``, ...)."""
        super().__init_subclass__()
        if algorithm is None:
            return
        registered = [name for name, _matrices in _core.algorithms()]
        if algorithm not in registered:
            raise ValueError(f"{cls.__name__}: algorithm {algorithm!r} is not registered; "
                             f"registered are {', '.join(registered)}")
        cls._algorithm = algorithm
        cls._make_engine = staticmethod(getattr(_core.Engine, algorithm))
        cls._own_torch_flags = schema.get("own_flags") or {}
        if "__init__" not in cls.__dict__:
            cls.__init__ = init_from_schema(algorithm, _EngineOptimizer.__init__, **schema)

    _in_backward = None  # the muon_cpp.step_in_backward handle while its hooks are on
    _pushed = _ending = None  # the settings the engine holds (_Pushed): as of the last step, this one

    def __init__(self, params, defaults, engine=None, process_group=None, shards=None):
        self._engine = None
        self._plan = None
        self._shards = shards  # the engine's tensors for sharded parameters, if made already
        self._process_group = process_group
        super().__init__(params, defaults)
        _add_hooks_torch_lacks(self)
        if engine is None:
            self._shards, self._plan, self._engine = self._build()
        else:
            self._engine = engine
        self._bound = self._param_lists()

    def _build(self):
        """(shards, owner plan, engine) over param_groups as they are: what updates what."""
        params = self._params()
        shards = plan = None
        if any(is_sharded(p) for p in params):
            shards = ShardedParams(params, self._updates_whole_tensors, self._matrix_flags(),
                                   self._process_group, type(self).__name__)
            if not self._updates_whole_tensors:
                shards.check_int8_state(self.param_groups, type(self).__name__)
        elif self._process_group is not None:
            plan = OwnerPlan(params, self._matrix_flags(), self._process_group)
        return shards, plan, self._new_engine(shards)

    def _new_engine(self, shards):
        held = (lambda p: p) if shards is None else shards.engine_tensor
        return self._make_engine(
            [([held(p) for p in group["params"]], self._engine_settings(group))
             for group in self.param_groups])

    # Whether each parameter is updated as a matrix (Muon, Dion) — one bool for all, or a list.
    def _matrix_flags(self):
        return self._updates_matrices

    # ---- the parameters the engine holds, and param_groups as they are now ----

    # A group's part of its structure beside its tensors (MuonWithAuxAdam: use_muon).
    def _group_kind(self, group):
        return None

    def _param_lists(self):
        """What the engine was built over: each group's tensors (held, so that no other tensor
        can take one's address or id) and kind."""
        return [(list(group["params"]), self._group_kind(group)) for group in self.param_groups]

    def _params_changed(self):
        """Whether param_groups' tensors differ from those the engine holds: one identity check
        per tensor, the whole cost of reading param_groups at every step."""
        groups = self.param_groups
        if len(groups) != len(self._bound):
            return True
        for group, (held, kind) in zip(groups, self._bound):
            now = group["params"]
            if (type(now) is not list or len(now) != len(held)
                    or any(map(operator.is_not, now, held)) or self._group_kind(group) != kind):
                return True
        return False

    def _bound_params(self):
        return [p for params, _ in self._bound for p in params]

    def _sync_params(self, who):
        """Rebuilds the engine when param_groups' tensors changed; an error leaves everything as it
        was (the old tensors keep their state) and says what ``who`` met."""
        if not self._params_changed():
            return
        try:
            self._rebind()
        except (ValueError, TypeError) as e:
            raise RuntimeError(f"{type(self).__name__}.{who}: param_groups changed since the "
                               f"optimizer last read them, and {e}") from e

    def _rebind(self):
        """The engine over param_groups as they are now, keeping each staying tensor's state (with
        a process group or sharded parameters a collective: every rank makes the same change)."""
        for number, group in enumerate(self.param_groups):
            group["params"] = _param_list(group["params"], number)
        _check_disjoint(self.param_groups)
        params = self._params()
        staying = {id(p) for p in params} & {id(p) for p in self._bound_params()}
        saved = {id(p): entry for p, entry in self._whole_state() if id(p) in staying}
        shards, plan, engine = self._build()
        owns = (shards.owns if shards is not None else
                plan.owns if plan is not None else (lambda p: True))
        states = []
        for index, p in enumerate(params):
            if id(p) in saved and owns(p):
                entry = saved[id(p)] if shards is None else shards.local_entry(p, saved[id(p)])
                states.append((index, p if shards is None else shards.engine_tensor(p), entry))
        engine.load([self._engine_settings(group) for group in self.param_groups], states)
        if shards is None:  # what the step would refuse, before the old engine is let go
            engine.check_step()
        self._shards, self._plan, self._engine = shards, plan, engine
        self._bound = self._param_lists()

    def _whole_state(self):
        """[(tensor, state entry)] of the tensors the engine holds, each entry whole — as one
        process keeps it (gathered from its owner or from every rank's rows: a collective)."""
        held = self._bound_params()
        local = {}
        for index, p in enumerate(held):
            entry = _state_entry(self._engine, self._engine_param(p))
            if entry is not None:
                local[index] = (entry if self._shards is None
                                else self._shards.whole_entry(p, entry))
        if self._group() is not None and (self._shards is None or self._shards.owners_hold_state):
            local = gather_state(local, self._group())
        return [(held[index], entry) for index, entry in local.items()]

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
        super().add_param_group(param_group)  # PyTorch's checks and defaults
        if self._engine is None:
            return
        try:  # the engine over all groups, which validates the new one
            self._rebind()
        except Exception:
            self.param_groups.pop()
            raise

    def step(self, closure=None):
        """Calls ``closure`` (if any) with gradients enabled, then updates every parameter that
        has a gradient. Returns the closure's loss. Under muon_cpp.step_in_backward the updates
        happen inside backward: step() only calls the closure (whose backward updates)."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        if self._in_backward is not None:
            return loss
        self._begin_step()
        if self._shards is not None:
            self._shards.step(self._params(), self._engine.step)
        elif self._plan is None:
            self._engine.step()
        else:
            self._step_owned()
        self._end_step()
        return loss

    def zero_grad(self, *args, **kwargs):
        """PyTorch's; under muon_cpp.step_in_backward nothing (the updates released the
        gradients, and with ``every=k`` the passes between add theirs up for the k-th)."""
        if self._in_backward is None:
            super().zero_grad(*args, **kwargs)

    # The step's first and last parts, outside the engine's updates (step_in_backward runs them
    # around the updates it makes inside backward).
    def _begin_step(self):
        """Rebinds the engine to param_groups' tensors if they changed, and checks and pushes the
        groups' settings into it (lr as a scheduler left it) if they changed since it last got
        them. What it got counts once the step has ended: a step that fails pushes again."""
        self._sync_params("step()")
        pushed, self._pushed = self._pushed, None
        if pushed is None or not pushed.holds(self._engine, self.param_groups):
            for group in self.param_groups:  # settings written under torch.optim's names
                self._from_torch_names(group)
            self._engine.set_options([self._engine_settings(group) for group in self.param_groups])
            pushed = _Pushed(self._engine, self.param_groups)
        self._ending = pushed

    def _end_step(self):
        """The step has ended: the engine holds what _begin_step pushed."""
        self._pushed, self._ending = self._ending, None

    def _step_owned(self):
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

    def state_dict(self):
        """PyTorch's layout: {'state': {index: {...}}, 'param_groups': [{..., 'params': [index]}]},
        parameters numbered in param_groups order. State tensors are the live buffers; with a
        process group, every owner's state gathered to every rank (a collective: call it on all
        ranks), as CPU copies — the state dict one process would have, loadable at any world
        size. With sharded (DTensor) parameters likewise: each rank's rows of the state gathered
        into whole tensors (a collective), the state dict one process would have. The state-dict
        pre- and post-hooks run around it, as torch.optim runs them."""
        for hook in _hooks(self, "_optimizer_state_dict_pre_hooks"):
            hook(self)
        out = self._state_dict()
        for hook in _hooks(self, "_optimizer_state_dict_post_hooks"):
            result = hook(self, out)
            if result is not None:
                out = result
        return out

    def _state_dict(self):
        self._sync_params("state_dict()")
        index = {id(p): i for i, p in enumerate(self._params())}
        groups = []
        for group in self.param_groups:
            packed = {key: value for key, value in group.items() if key != "params"}
            packed["params"] = [index[id(p)] for p in group["params"]]
            groups.append(packed)
        state = {index[id(p)]: entry for p, entry in self._whole_state()}
        return {"state": dict(sorted(state.items())), "param_groups": groups}

    def load_state_dict(self, state_dict):
        """Replaces settings and state with ``state_dict``'s (from this class's state_dict()).
        Everything is checked first; on any error nothing changes. The load-state-dict pre-hooks
        (which may return a replacement) and post-hooks run around it, as in torch.optim."""
        if not isinstance(state_dict, dict):
            raise TypeError(f"state_dict must be a dict, got {type(state_dict).__name__}")
        state_dict = state_dict.copy()  # shallow, as torch.optim hands it to the hooks
        for hook in _hooks(self, "_optimizer_load_state_dict_pre_hooks"):
            result = hook(self, state_dict)
            if result is not None:
                state_dict = result
        self._load_state_dict(state_dict)
        for hook in _hooks(self, "_optimizer_load_state_dict_post_hooks"):
            hook(self)

    def _load_state_dict(self, state_dict):
        self._sync_params("load_state_dict()")
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
        converted = self._engine.load([self._engine_settings(group) for group in settings],
                                      states)
        if converted:  # state_dtype changed since the state was saved: converted once, said once
            logging.getLogger("muon_cpp").warning(
                "load_state_dict: %d optimizer state tensors converted to this optimizer's "
                "state_dtype (%s%s)", len(converted), converted[0],
                ", ..." if len(converted) > 1 else "")
        for group, saved in zip(self.param_groups, settings):
            group.update(saved)
        self._load_extra(state_dict)

    # ---- copies: copy.deepcopy and pickle ----

    def __getstate__(self):
        if self._group() is not None:
            raise TypeError(f"{type(self).__name__} over a process group (or sharded parameters) "
                            "cannot be copied or pickled: its state is spread over ranks; save "
                            "state_dict() instead")
        self._sync_params("__getstate__()")
        return {"defaults": self.defaults, "param_groups": self.param_groups,
                "state": dict(self._whole_state()), "extra": self._copied_extra()}

    def __setstate__(self, state):
        state = dict(state)
        saved_state, extra = state.pop("state", {}), state.pop("extra", None)
        Optimizer.__setstate__(self, state)  # param_groups, defaults, torch's hook tables
        _add_hooks_torch_lacks(self)
        self._engine, self._plan, self._shards, self._process_group = None, None, None, None
        self._engine = self._copied_engine(extra)
        self._bound = self._param_lists()
        params = self._params()
        index = {id(p): i for i, p in enumerate(params)}
        self._engine.load([self._engine_settings(group) for group in self.param_groups],
                          [(index[id(p)], p, entry) for p, entry in saved_state.items()])

    # What a copy needs beyond param_groups and state to rebuild the engine (a subclass's), and
    # the engine rebuilt from it (before the state goes in).
    def _copied_extra(self):
        return None

    def _copied_engine(self, extra):
        return self._build()[2]

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
        check_group_keys(settings, type(self).__name__, self._algorithm, self._own_keys())
        return settings

    # The keys of a param group this class reads beyond its algorithm's options (torch's names).
    def _own_keys(self):
        return ()

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
        return None if engine is None else _state_entry(engine, self._optimizer._engine_param(p))

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


def _state_entry(engine, tensor):
    """The engine's state of ``tensor`` in torch.optim's form — the step count a float tensor —
    or None before its first update (or for a tensor the engine does not hold)."""
    entry = engine.state(tensor)
    if entry is not None:
        entry["step"] = torch.tensor(float(entry["step"]))
    return entry


# ---- torch.optim's hooks on state dicts: run as torch runs them, and added where torch (1.13)
# has none, with torch 2's signatures ----

_STATE_DICT_HOOKS = ("_optimizer_state_dict_pre_hooks", "_optimizer_state_dict_post_hooks",
                     "_optimizer_load_state_dict_pre_hooks",
                     "_optimizer_load_state_dict_post_hooks")


def _hooks(optimizer, table):
    return list(optimizer.__dict__.get(table, {}).values())


def _add_hooks_torch_lacks(optimizer):
    for table in _STATE_DICT_HOOKS:
        optimizer.__dict__.setdefault(table, collections.OrderedDict())


def _registrar(table, doc):
    def register(self, hook, prepend=False):
        handle = torch.utils.hooks.RemovableHandle(self.__dict__[table])
        self.__dict__[table][handle.id] = hook
        if prepend:
            self.__dict__[table].move_to_end(handle.id, last=False)
        return handle
    register.__doc__ = doc + " (torch.optim's, for a PyTorch that has none); returns a handle."
    return register


if not hasattr(Optimizer, "register_state_dict_pre_hook"):  # PyTorch < 2.1
    for _table, _name, _doc in zip(_STATE_DICT_HOOKS, (
            "register_state_dict_pre_hook", "register_state_dict_post_hook",
            "register_load_state_dict_pre_hook", "register_load_state_dict_post_hook"), (
            "hook(optimizer) before state_dict()",
            "hook(optimizer, state_dict) -> a replacement or None, after state_dict()",
            "hook(optimizer, state_dict) -> a replacement or None, before load_state_dict()",
            "hook(optimizer) after load_state_dict()")):
        setattr(_EngineOptimizer, _name, _registrar(_table, _doc))


# ---- param_groups' tensors as code between steps may leave them ----

def _param_list(params, number):
    """A group's 'params' as a list of tensors, as torch.optim's add_param_group makes it."""
    if isinstance(params, torch.Tensor):
        return [params]
    if isinstance(params, set):
        raise TypeError(f"param group {number}: 'params' is a set; optimizer parameters need an "
                        "ordered collection (a list), as the order of a set changes between runs")
    try:
        params = list(params)
    except TypeError:
        raise TypeError(f"param group {number}: 'params' must be a list of tensors, got "
                        f"{type(params).__name__}") from None
    for index, p in enumerate(params):
        if not isinstance(p, torch.Tensor):
            raise TypeError(f"parameter {index} of param group {number} is a "
                            f"{type(p).__name__}, not a tensor")
        if not (p.is_leaf or p.retains_grad):
            raise ValueError(f"parameter {index} of param group {number} is not a leaf tensor "
                             "(the result of an operation); optimize leaf tensors")
    return params


def _check_disjoint(groups):
    seen = {}
    for number, group in enumerate(groups):
        for index, p in enumerate(group["params"]):
            if id(p) in seen:
                raise ValueError(f"parameter {index} of param group {number} is also parameter "
                                 "{1} of param group {0}; a parameter belongs to one group"
                                 .format(*seen[id(p)]))
            seen[id(p)] = (number, index)


# ---- keys of a param group that another algorithm reads ----

_ALGORITHMS = {name: matrices for name, matrices in _core.algorithms()}
_OPTIONS_OF = {name: {option for option, *_ in _core.option_schema(name)} for name in _ALGORITHMS}


def _title(algorithm):
    return {"adamw": "AdamW", "nadam": "NAdam"}.get(algorithm, algorithm.capitalize())


def check_group_keys(settings, who, algorithm, own_keys=()):
    """Refuses a param group that another algorithm would read differently, rather than training
    its tensors by ``algorithm`` (this class's, on every group) and ignoring what it says:
    KellerJordan/Muon's ``use_muon``, a group naming another ``algorithm`` (microsoft/dion's), or
    an option of another registered algorithm that ``algorithm`` lacks (Adam's betas in a Muon
    group). Keys no algorithm reads (initial_lr, a user's own) are kept, as torch keeps them."""
    if algorithm is None:
        return
    if "use_muon" in settings:
        raise ValueError(f"{who}: a param group has use_muon={settings['use_muon']!r}, "
                         "KellerJordan/Muon's key choosing Muon or Adam per group; this class runs "
                         f"{_title(algorithm)} on every group. Use muon_cpp.MuonWithAuxAdam "
                         "for such groups (or muon_cpp.HybridOptimizer, which routes by shape)")
    named = settings.get("algorithm", algorithm)
    if named != algorithm:
        raise ValueError(f"{who}: a param group has algorithm={named!r}; this class runs "
                         f"{_title(algorithm)} on every group. Give that group to its own "
                         "optimizer, or use muon_cpp.HybridOptimizer")
    own = _OPTIONS_OF[algorithm] | set(own_keys)
    for key in settings:
        if key in own or not isinstance(key, str):
            continue
        readers = [name for name, options in _OPTIONS_OF.items() if key in options]
        if readers:
            raise ValueError(
                f"{who}: a param group has {key!r}, an option of "
                f"{', '.join(_title(r) for r in readers)} but not of {_title(algorithm)}, which "
                "would ignore it and train the group's tensors as its own. For Muon on some "
                "groups and Adam on others use muon_cpp.MuonWithAuxAdam (KellerJordan/Muon's "
                "use_muon groups) or muon_cpp.HybridOptimizer (routing by shape)")


class _Pushed:
    """param_groups' settings as an engine got them, to tell at the next step whether they have
    changed: a copy of each group, and the values that can change in place (a scheduler fills a
    tensor lr in place) as they were."""

    def __init__(self, engine, groups):
        self.engine = engine
        self.groups = [dict(group) for group in groups]
        self.values = [{key: _frozen(value) for key, value in group.items()
                        if key not in _NOT_SETTINGS and not _plain(value)} for group in groups]

    def holds(self, engine, groups):
        if engine is not self.engine or len(groups) != len(self.groups):
            return False
        for group, copy, values in zip(groups, self.groups, self.values):
            if any(group.get(key) is not copy.get(key) for key in _NOT_SETTINGS):
                return False  # other lists of tensors: not compared by value
            if not values:
                if group != copy:
                    return False
            elif group.keys() != copy.keys() or any(
                    _frozen(value) != values[key] if key in values else value != copy[key]
                    for key, value in group.items() if key not in _NOT_SETTINGS):
                return False
        return True


_NOT_SETTINGS = ("params", "param_names")  # _sync_params compares the tensors
_PLAIN = frozenset((float, int, bool, str, type(None), torch.dtype, torch.device))  # immutable


def _plain(value):
    return type(value) in _PLAIN or (type(value) is tuple and all(map(_plain, value)))


def _frozen(value):
    if isinstance(value, torch.Tensor):
        return ("tensor", value.dtype, value.tolist())
    if isinstance(value, (list, tuple)):
        return (type(value), tuple(_frozen(item) for item in value))
    if isinstance(value, dict):
        return (dict, tuple((key, _frozen(item)) for key, item in value.items()))
    return value


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
