"""muon_cpp.Dion: Dion (Ahn et al., arXiv 2504.05295) with microsoft/dion's keywords, and the
reading of state dicts saved when Dion was a Muon setting."""

from . import _core
from ._engine import _EngineOptimizer
from ._schema import init_from_schema

_DION = {name: default for name, default, _doc, _range in _core.option_schema("dion")}

# Muon's options that Dion has no counterpart of: a state dict saved when Dion was a Muon setting
# holds them beside Dion's (at values Dion ran with, or was refused).
_MUON_DEFAULTS = {name: default for name, default, _doc, _range in _core.option_schema("muon")}
_MUON_ONLY = (set(_MUON_DEFAULTS) - set(_DION)) | {"dion"}
# Dion's momentum is summed, without Nesterov: these values of Muon's settings say so.
_DIONS_MOMENTUM = {"nesterov": False, "momentum_form": "sum"}
_DION_INIT = init_from_schema("dion", _EngineOptimizer.__init__, positional=0)


class Dion(_EngineOptimizer, algorithm="dion"):
    """Dion (Ahn et al., arXiv 2504.05295; docs/design.md §Dion): a rank-r orthonormal update
    from one power iteration per step with error feedback, in microsoft/dion's keywords:

    ``Dion(params, lr=0.01, mu=0.95, weight_decay=0.01, *, rank_fraction=1.0,
    rank_multiple_of=1, epsilon=1e-8, **options)``; ``options`` are Dion's others
    (weight_decay_method, adjust_lr, cautious, cautious_weight_decay, mantissa_tracking, fused;
    docs/python.md) and ``process_group``; Muon's keywords are accepted where they say what Dion
    does (``nesterov=False``, ``momentum_form='sum'``, Muon's defaults) and refused otherwise. Param groups and state dicts
    use Dion's option names (``momentum`` for ``mu``); the state holds ``momentum_buffer`` and
    ``dion_q``, the right factor Q. State dicts saved when Dion was a Muon setting (groups with a
    ``dion`` dict beside Muon's keys) load.

    microsoft/dion's other keywords are taken by name (its positional order differs: meshes come
    first there): ``qr_method`` ('qr', 'cqr' or 'rcqr'), ``cqr_warmup_steps`` and
    ``rcqr_oversample`` choose how dion computes the QR; the orthonormal basis is the same in
    exact arithmetic (column signs cancel in P·Rᵀ and the update), and muon-cpp computes it by
    Householder QR. ``power_iters`` must be 1, the meshes and ``mixed_precision_config`` None
    and ``betas`` dion's default (they set its AdamW/Lion groups; this class trains matrices only:
    give the rest to ``AdamW`` or use ``build_optimizer`` with ``name: dion``).
    """

    _updates_matrices = True
    _updates_whole_tensors = True

    def __init__(self, params, lr=_DION["lr"], mu=_DION["momentum"],
                 weight_decay=_DION["weight_decay"], *,
                 rank_fraction=_DION["rank_fraction"],
                 rank_multiple_of=_DION["rank_multiple_of"],
                 epsilon=_DION["epsilon"], replicate_mesh=None, outer_shard_mesh=None,
                 inner_shard_mesh=None, replicate_mesh_grad_sync=True, betas=(0.9, 0.95),
                 power_iters=1, qr_method="rcqr", cqr_warmup_steps=150, rcqr_oversample=1.25,
                 mixed_precision_config=None, **options):
        _check_dion_keywords(locals())
        _DION_INIT(self, params, lr=lr, momentum=mu, weight_decay=weight_decay,
                   rank_fraction=rank_fraction, rank_multiple_of=rank_multiple_of,
                   epsilon=epsilon, **_without_muon_keywords(options))

    def _loaded_group(self, saved):
        rank = saved.get("dion")
        saved = {key: value for key, value in saved.items() if key not in _MUON_ONLY}
        if isinstance(rank, dict):
            saved.update(rank)
        return saved


def _without_muon_keywords(options):
    """``options`` without Muon's keywords that say what Dion does (muon_cpp.Dion passed Muon's
    keywords on when Dion was a Muon setting): Muon's default, or for ``nesterov`` and
    ``momentum_form`` Dion's own momentum. Any other value of one is a ValueError."""
    kept = dict(options)
    for name in set(kept) & (_MUON_ONLY - {"dion"}):
        does = _DIONS_MOMENTUM.get(name, _MUON_DEFAULTS[name])
        if kept[name] != does:
            raise ValueError(f"Dion: {name}={kept[name]!r} would do nothing: {name} is Muon's "
                             f"setting, not Dion's; only {does!r}, which says what Dion does, is "
                             "accepted")
        del kept[name]
    return kept


def _check_dion_keywords(given):
    """microsoft/dion's keywords that muon_cpp.Dion takes only where they change nothing here."""
    for mesh in ("replicate_mesh", "outer_shard_mesh", "inner_shard_mesh"):
        if given[mesh] is not None:
            raise ValueError(f"Dion: {mesh} must be None: muon-cpp's Dion does not shard over "
                             "device meshes")
    if not isinstance(given["replicate_mesh_grad_sync"], bool):
        raise TypeError("Dion: replicate_mesh_grad_sync must be a bool")
    if given["mixed_precision_config"] is not None:
        raise ValueError("Dion: mixed_precision_config must be None: Dion's momentum and Q stay "
                         "in float32 (float64 for float64 parameters)")
    if given["power_iters"] != 1 or isinstance(given["power_iters"], bool):
        raise ValueError(f"Dion: power_iters must be 1 (one power iteration per step, the "
                         f"paper's Algorithm 1), got {given['power_iters']!r}")
    if given["qr_method"] not in ("qr", "cqr", "rcqr"):
        raise ValueError(f"Dion: qr_method must be 'qr', 'cqr' or 'rcqr', got "
                         f"{given['qr_method']!r}")
    if tuple(given["betas"]) != (0.9, 0.95):
        raise ValueError(f"Dion: betas {tuple(given['betas'])} would do nothing: they are "
                         "microsoft/dion's AdamW/Lion betas for non-matrix parameters, and this "
                         "class trains matrices only; give those to muon_cpp.AdamW(betas=...) or "
                         "use build_optimizer with name: dion and betas")
    for name, least in (("cqr_warmup_steps", 0), ("rcqr_oversample", 1)):
        value = given[name]
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not value >= least:
            raise ValueError(f"Dion: {name} must be a number >= {least}, got {value!r}")


