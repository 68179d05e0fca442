"""The constructors of muon_cpp's optimizer classes, made from the C++ option schema
(muon/option_schema.h): keywords, defaults, order and documentation in one place."""

import inspect

from . import _core


def init_from_schema(algorithm, base_init, positional, aliases=None, presets=None, own_flags=None,
                     presets_elsewhere=None):
    """An __init__(self, params, <options>) whose keywords, defaults and order are the C++
    option schema's (muon/option_schema.h): the first ``positional`` options may also be given
    by position, as in torch.optim; the rest are keyword-only. After them come torch.optim's
    implementation flags and the class's ``own_flags`` (AMSGRAD, ...), ``aliases``
    (torch.optim's name → ours) and, with ``presets`` (name → defaults under our names), a
    keyword ``preset``. With a preset (another library's defaults) options are taken by keyword
    only, since that library's positional order may differ from ours. ``presets_elsewhere``: the
    presets of another class (name → that class), which the error for such a name points to.
    The settings go to ``base_init(self, params, settings, process_group=...)``, the base class's
    __init__ (passed in: this module imports no optimizer class)."""
    options = _core.option_schema(algorithm)
    aliases = aliases or {}
    parameters = [inspect.Parameter("self", inspect.Parameter.POSITIONAL_OR_KEYWORD),
                  inspect.Parameter("params", inspect.Parameter.POSITIONAL_OR_KEYWORD)]
    for index, (name, default, _doc, _range) in enumerate(options):
        kind = (inspect.Parameter.POSITIONAL_OR_KEYWORD if index < positional
                else inspect.Parameter.KEYWORD_ONLY)
        parameters.append(inspect.Parameter(name, kind, default=default))
    extra = [(name, None) for name in aliases]
    extra += [(name, None if name == "foreach" else False) for name in TORCH_IMPLEMENTATION_FLAGS]
    extra += [(name, None if why is None else False) for name, why in (own_flags or {}).items()]
    if presets:
        extra.append(("preset", None))
    extra.append(("process_group", None))
    for name, default in extra:
        parameters.append(inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=default))
    signature = inspect.Signature(parameters)

    def __init__(self, *args, **kwargs):
        try:
            given = dict(signature.bind(self, *args, **kwargs).arguments)
        except TypeError as error:
            raise TypeError(_call_error(type(self).__name__, signature, kwargs, error)) from None
        del given["self"]
        params = given.pop("params")
        if given.get("preset") is not None and len(args) > 2:
            order = ", ".join(name for name, *_ in options[:positional])
            raise TypeError(f"{type(self).__name__}: with preset={given['preset']!r} give the "
                            f"options after lr by keyword: the positional order here is "
                            f"({order}), which may not be that library's"
                            + (" (the drop-in with torch.optim.Muon's order is "
                               "muon_cpp.optim.Muon)" if given["preset"] == "torch" else ""))
        settings = {name: default for name, default, _doc, _range in options}
        settings.update(_preset(presets, given.pop("preset", None), presets_elsewhere or {}))
        for theirs, ours in aliases.items():
            if theirs in given and ours in given:
                raise ValueError(f"{type(self).__name__}: give {ours} or {theirs} "
                                 f"(torch.optim's name for it), not both")
        process_group = given.pop("process_group", None)
        settings.update(given)
        base_init(self, params, self._from_torch_names(settings), process_group=process_group)

    __init__.__signature__ = signature
    __init__.__doc__ = "Options:\n" + "\n".join(
        f"    {name} (default {default!r}{', ' + rng if rng else ''}): {doc}"
        for name, default, doc, rng in options) + "\n" + _TORCH_KEYWORDS_DOC + "".join(
        f"\n    {theirs}: torch.optim's keyword for {ours}" for theirs, ours in aliases.items()) + "".join(
        f"\n    {name}: " + (f"accepted when False; {why}" if why else
                              "accepted, True or False: the same arithmetic")
        for name, why in (own_flags or {}).items()) + _PROCESS_GROUP_DOC
    return __init__


def _call_error(class_name, signature, kwargs, error):
    """The TypeError of a call its signature refused, naming the class, its keywords and, for an
    unknown keyword another algorithm takes, that algorithm."""
    keywords = [name for name in signature.parameters if name not in ("self", "params")]
    message = f"{class_name}: {error}; its keywords are {', '.join(keywords)}"
    for key in kwargs:
        if key in signature.parameters:
            continue
        owners = [name for name, _matrices in _core.algorithms()
                  if any(option == key for option, *_ in _core.option_schema(name))]
        if owners:
            message += (f". {key} is an option of {', '.join(owners)}: give those parameters to "
                        "that optimizer, or every parameter to muon_cpp.HybridOptimizer, which "
                        "routes each to its algorithm")
    return message


_TORCH_KEYWORDS_DOC = (
    "    foreach, maximize, capturable, differentiable: torch.optim's implementation flags;\n"
    "        foreach has no effect, the others are accepted when False (their default)")


_PROCESS_GROUP_DOC = (
    "\n    process_group: a torch.distributed process group (e.g. torch.distributed.group.WORLD) "
    "to share\n        the updates over, ZeRO-1 style: each parameter is updated on one owner "
    "rank, which\n        alone keeps its state, and its new values reach every rank; the "
    "gradients must\n        already agree across ranks (DDP averages them). None: one process "
    "(docs/distributed.md)")


def _preset(presets, name, elsewhere):
    """The defaults preset ``name`` sets ({} for None: the schema's own)."""
    if name is None:
        return {}
    if not presets or name not in presets:
        valid = ", ".join(repr(n) for n in presets or {})
        hint = f" (the preset {name!r} is {elsewhere[name]}'s defaults)" if name in elsewhere else ""
        raise ValueError(f"preset must be None (muon-cpp's defaults) or one of {valid}, "
                         f"got {name!r}{hint}")
    return dict(presets[name])


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
