"""torch.optim.Muon's keywords, defaults and param-group keys, and their translation into
muon-cpp's Muon options (docs/python.md §torch.optim.Muon).

torch.optim.Muon keeps its settings in param_groups under its own names; muon-cpp's engine reads
ours. The names that differ:

    torch.optim.Muon            muon-cpp
    ns_coefficients (a, b, c)   coefficients ('quintic' for torch's default row, else [[a, b, c]])
    eps                         ns_eps
    adjust_lr_fn (None)         adjust_lr ('original')
    gram_ns_coefficients        gram_coefficients (used while use_gram_newton_schulz is True)
    gram_ns_reset_iterations    gram_restarts (0 is dropped, as torch ignores it; [] is None)
    use_gram_newton_schulz      whether gram_coefficients is set
    use_cuda_graph              — (accepted; muon-cpp captures no CUDA graphs)

lr, weight_decay, momentum, nesterov and ns_steps are the same in both.
"""
import weakref

import torch


# Keller Jordan's quintic, torch.optim.Muon's default ns_coefficients.
QUINTIC = (3.4445, -4.775, 2.0315)

# torch.optim.Muon's Gram Newton–Schulz defaults (PyTorch's torch/optim/_muon.py): the quintic for
# each of 5 iterations, never reset.
DEFAULT_GRAM_NS_COEFFICIENTS = [list(QUINTIC) for _ in range(5)]
GRAM_CONFIG_KEYS = ("gram_ns_coefficients", "gram_ns_reset_iterations", "use_cuda_graph")

# torch's group key → ours, for the keys that are renamed one to one.
ALIASES = {"ns_coefficients": "coefficients", "eps": "ns_eps", "adjust_lr_fn": "adjust_lr",
           "gram_ns_coefficients": "gram_coefficients",
           "gram_ns_reset_iterations": "gram_restarts"}
# Every param-group key of torch.optim.Muon that muon-cpp names otherwise, with the key of ours
# that carries it (use_cuda_graph has none).
COUNTERPARTS = dict(ALIASES, use_gram_newton_schulz="gram_coefficients", use_cuda_graph=None)
TORCH_ONLY_KEYS = tuple(COUNTERPARTS)

# torch's eps for our default normalization X / ‖X‖_F (no eps: the update does not depend on the
# gradient's scale): torch divides by max(‖X‖_F, eps), so float32's smallest normal number.
FLOAT32_TINY = 1.1754943508222875e-38


def gram_group_keys(use_gram_newton_schulz, gram_newton_schulz_config):
    """The four Gram keys torch.optim.Muon puts in every param group, from its two constructor
    keywords, checked as torch checks them."""
    _check_bool("use_gram_newton_schulz", use_gram_newton_schulz)
    config = gram_newton_schulz_config
    if config is not None and not use_gram_newton_schulz:
        raise ValueError("gram_newton_schulz_config is only valid when use_gram_newton_schulz="
                         f"True; got gram_newton_schulz_config={config!r} with "
                         "use_gram_newton_schulz=False")
    if config is None:
        config = {}
    if not isinstance(config, dict):
        raise TypeError("gram_newton_schulz_config must be a dict or None, got "
                        f"{type(config).__name__}")
    unknown = sorted(set(config) - set(GRAM_CONFIG_KEYS))
    if unknown:
        raise ValueError(f"gram_newton_schulz_config: unknown keys {unknown}; valid keys are "
                         f"{', '.join(GRAM_CONFIG_KEYS)}")
    coefficients = config.get("gram_ns_coefficients")
    resets = config.get("gram_ns_reset_iterations")
    use_cuda_graph = config.get("use_cuda_graph", False)
    _check_bool("gram_newton_schulz_config['use_cuda_graph']", use_cuda_graph)
    return {"use_gram_newton_schulz": use_gram_newton_schulz,
            "gram_ns_coefficients": ([list(row) for row in DEFAULT_GRAM_NS_COEFFICIENTS]
                                     if coefficients is None else coefficients),
            "gram_ns_reset_iterations": [] if resets is None else resets,
            "use_cuda_graph": use_cuda_graph}


def to_ours(settings):
    """Rewrites torch.optim.Muon's keys in the settings dict ``settings`` into ours, in place, and
    returns it. A torch key replaces its counterpart of ours (it is the later write: muon-cpp never
    stores torch's names)."""
    for theirs, ours in ALIASES.items():
        if theirs in settings:
            settings[ours] = _CONVERT[theirs](settings.pop(theirs))
    if "use_cuda_graph" in settings:
        _check_bool("use_cuda_graph", settings.pop("use_cuda_graph"))
    if "use_gram_newton_schulz" in settings:
        use = settings.pop("use_gram_newton_schulz")
        _check_bool("use_gram_newton_schulz", use)
        if not use:
            settings["gram_coefficients"] = None
        elif settings.get("gram_coefficients") is None:
            settings["gram_coefficients"] = [list(row) for row in DEFAULT_GRAM_NS_COEFFICIENTS]
    return settings


def torch_view(settings, table_of):
    """torch.optim.Muon's keys for a group of our ``settings``, or None when torch.optim.Muon
    cannot run that group as it is (another momentum form or decay method, a table it cannot
    express, NorMuon, Dion, ...) or a setting is invalid (written into the group and not yet
    checked by a step). ``table_of(coefficients)`` gives a table's rows, safety and eps."""
    try:
        return _torch_view(settings, table_of)
    except (TypeError, ValueError, RuntimeError, OverflowError):  # float() of a huge int
        return None


# Our settings torch.optim.Muon has no counterpart of, at the values that do what it does.
_AS_TORCH_DOES = {"momentum_form": "ema", "weight_decay_method": "decoupled", "post_norm": "none",
                  "normuon": None, "row_equilibration": False, "num_heads": None,
                  "split_sizes": None, "cautious": False, "cautious_weight_decay": False,
                  "mantissa_tracking": False}


def _torch_view(settings, table_of):
    if any(settings.get(key, value) != value for key, value in _AS_TORCH_DOES.items()):
        return None
    adjust_lr = settings.get("adjust_lr", "original")
    table = table_of(settings.get("coefficients", "quintic"))
    if adjust_lr not in ("original", "match_rms_adamw") or len(table["rows"]) != 1 or (
            table["safety"] != 1.0):
        return None
    gram = settings.get("gram_coefficients")
    restarts = settings.get("gram_restarts")
    eps = settings.get("ns_eps")
    return {"ns_coefficients": tuple(table["rows"][0]),
            "eps": (table["eps"] or FLOAT32_TINY) if eps is None else float(eps),
            "adjust_lr_fn": None if adjust_lr == "original" else adjust_lr,
            "use_gram_newton_schulz": gram is not None,
            "gram_ns_coefficients": _rows(DEFAULT_GRAM_NS_COEFFICIENTS if gram is None
                                          else table_of(gram)["rows"]),
            "gram_ns_reset_iterations": [int(i) for i in restarts or ()] if gram is not None
                                        else [],
            "use_cuda_graph": False}


def drop_duplicates(saved, view, keep):
    """A loaded group that holds both torch's keys and ours (muon_cpp.Muon.state_dict() writes
    both): where a torch key equals what ours give (``view``, from torch_view), the side not named
    by ``keep`` ('ours' or 'torch') is dropped; where it differs, torch code changed it after the
    save, so it replaces ours. Returns the group."""
    pairs = [(key, COUNTERPARTS[key]) for key in TORCH_ONLY_KEYS
             if key in saved and COUNTERPARTS[key] in saved]
    if pairs and view is None:
        raise ValueError(f"state dict group gives both {pairs[0][0]} and {pairs[0][1]}, for "
                         "settings torch.optim.Muon cannot express; keep one of them")
    # Two torch keys can share a counterpart (use_gram_newton_schulz and gram_ns_coefficients
    # both carry gram_coefficients), so it may be gone already.
    for key, counterpart in pairs:
        if _plain(saved[key]) != _plain(view[key]) or keep == "torch":
            saved.pop(counterpart, None)
        else:
            saved.pop(key)
    return saved


def _check_bool(name, value):
    if not isinstance(value, bool):
        raise TypeError(f"{name} must be True or False, got {type(value).__name__} {value!r:.40}")


def _ns_coefficients(value):
    if _is_one_row(value):
        return "quintic" if tuple(value) == QUINTIC else [list(value)]
    if not isinstance(value, (str, list, tuple)):
        raise TypeError("ns_coefficients must be (a, b, c), a table name or [[a, b, c], ...], "
                        f"got {type(value).__name__} {value!r:.40}")
    return value


def _adjust_lr_fn(value):
    if value is None:
        return "original"
    if value not in ("original", "match_rms_adamw"):
        raise ValueError("adjust_lr_fn must be None, 'original' or 'match_rms_adamw' "
                         f"(torch.optim.Muon's), got {value!r}; adjust_lr also takes 'spectral' "
                         "and 'none'")
    return value


def _gram_ns_coefficients(value):
    if not isinstance(value, (list, tuple)) or not all(_is_one_row(row) for row in value):
        raise TypeError("gram_ns_coefficients must be a list of [a, b, c] rows, one per "
                        f"iteration, got {value!r:.60}")
    return [list(row) for row in value]


def _gram_ns_reset_iterations(value):
    """torch resets before iteration i for each i listed, i > 0: after i iterations, which is
    what our gram_restarts counts."""
    if not isinstance(value, (list, tuple)) or not all(
            isinstance(i, int) and not isinstance(i, bool) for i in value):
        raise TypeError(f"gram_ns_reset_iterations must be a list of ints, got {value!r:.60}")
    if any(i < 0 for i in value):
        raise ValueError("gram_ns_reset_iterations must be iteration indices >= 0, got "
                         f"{list(value)}")
    restarts = tuple(sorted({i for i in value if i > 0}))
    # None, not (): where torch resets nowhere, muon-cpp's own restart points stand (they change
    # rounding only; docs/algorithms.md §Gram Newton–Schulz).
    return restarts or None


_CONVERT = {"ns_coefficients": _ns_coefficients, "eps": lambda value: value,
            "adjust_lr_fn": _adjust_lr_fn, "gram_ns_coefficients": _gram_ns_coefficients,
            "gram_ns_reset_iterations": _gram_ns_reset_iterations}


def _is_one_row(value):
    return (isinstance(value, (tuple, list)) and len(value) == 3
            and all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in value))


def _rows(rows):
    return [list(row) for row in rows]


def _plain(value):
    """Tuples as lists, recursively, so that a saved value and a computed one compare equal."""
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


# ---- the step count through torch.optim.Muon ----
#
# A muon-cpp state dict carries each parameter's 'step' (its bf16 state's stochastic rounding
# follows it). torch.optim.Muon keeps that key when it loads the dict but never advances it, so a
# run moved to torch.optim.Muon and back would resume with the count it left with. Once muon_cpp is
# imported, the global step hooks below advance it for torch.optim.Muon, for each parameter that
# took a step — only where torch left the count untouched, so a torch that counts is not doubled.

_pending_counts = weakref.WeakKeyDictionary()  # optimizer → [(state, step tensor, its version)]


def _before_torch_muon_step(optimizer, args, kwargs):
    if not isinstance(optimizer, torch.optim.Muon):
        return
    counts = []
    for group in optimizer.param_groups:
        for p in group["params"]:
            state = optimizer.state.get(p)
            if p.grad is not None and state is not None and torch.is_tensor(state.get("step")):
                counts.append((state, state["step"], state["step"]._version))
    _pending_counts[optimizer] = counts


def _after_torch_muon_step(optimizer, args, kwargs):
    for state, step, version in _pending_counts.pop(optimizer, ()):
        if state.get("step") is step and step._version == version:
            with torch.no_grad():
                step.add_(1)


def count_steps_through_torch_muon():
    """Registers the hooks (at import) where this torch has torch.optim.Muon."""
    if hasattr(torch.optim, "Muon"):
        from torch.optim.optimizer import (register_optimizer_step_post_hook,
                                           register_optimizer_step_pre_hook)
        register_optimizer_step_pre_hook(_before_torch_muon_step)
        register_optimizer_step_post_hook(_after_torch_muon_step)
