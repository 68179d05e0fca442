"""The step inside backward (docs/python.md §The step inside backward): each parameter updated as
soon as its gradient of a backward pass is complete, its gradient released at once, so that the
model's whole set of gradients is never held. The hooks and the passes are C++'s
(muon/step_in_backward.h); this module checks what Python can check first and keeps
param_groups the source of settings."""

import torch

from . import _core
from ._engine import _EngineOptimizer


class StepInBackward:
    """What ``muon_cpp.step_in_backward`` returns. ``remove()`` takes the hooks off (gradients stay
    in ``.grad`` again, for ``optimizer.step()``); ``steps`` counts the steps made inside
    backward, ``seconds`` the time their updates took."""

    def __init__(self, optimizer, every):
        self._optimizer = optimizer
        self._hooks = _core.StepInBackward(optimizer._engine, every,
                                           lambda: _before_step(optimizer), optimizer._end_step)
        optimizer._in_backward = self

    def remove(self):
        if self._optimizer._in_backward is self:
            self._hooks.remove()
            self._optimizer._in_backward = None

    @property
    def steps(self):
        return self._hooks.steps

    @property
    def seconds(self):
        return self._hooks.seconds

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.remove()


def step_in_backward(optimizer, every=1):
    """Updates each parameter of ``optimizer`` (any muon_cpp optimizer) inside backward, as soon as
    its gradient of the pass is complete, with the bits ``optimizer.step()`` would give it, and
    releases that gradient (``grad`` becomes None): the gradients of the whole model are never
    held at once. With ``every=k`` (gradient accumulation) every k-th backward updates and the
    passes between add their gradients up in ``.grad``.

    Then ``optimizer.step()`` only calls its closure (whose backward updates) and ``zero_grad()``
    does nothing, so an ordinary training loop runs unchanged; ``param_groups`` stay the source of
    settings (an LR scheduler's lr is read at the next pass), and ``state_dict()``, checkpoints
    and resuming are as without it. Returns a handle: ``remove()`` (also on leaving a ``with``
    block) goes back to ordinary steps.

    Refused, naming the setting: clipping by the global gradient norm, the nonfinite policies
    ``skip`` and ``error`` (use ``nonfinite: ignore``), process groups, DDP and FSDP2 — each
    needs every gradient before the first update."""
    if not isinstance(optimizer, _EngineOptimizer):
        raise TypeError("step_in_backward needs a muon_cpp optimizer, got "
                        f"{type(optimizer).__module__}.{type(optimizer).__qualname__}; for "
                        "torch.optim's, PyTorch's tutorial 'How to save memory by fusing the "
                        "optimizer step into the backward pass' shows the hooks to write")
    if isinstance(every, bool) or not isinstance(every, int):
        raise TypeError(f"every must be an int (backward passes per step), got "
                        f"{type(every).__name__}")
    if every < 1:
        raise ValueError(f"every must be >= 1 (backward passes per step), got {every}")
    if optimizer._in_backward is not None:
        raise ValueError(f"this {type(optimizer).__name__} already steps inside backward; "
                         "remove() that handle first")
    if optimizer._group() is not None or _several_ranks():
        raise ValueError(
            "step_in_backward runs in one process: with a process group, DDP or FSDP2 the "
            "gradients are averaged across ranks before any update, and a parameter's own "
            "gradient is not the one to step with (docs/python.md §The step inside backward: "
            "what it would take); step after backward there")
    optimizer._begin_step()
    optimizer._engine.begin_parameter_steps()  # refuses what it cannot do, before any hook
    return StepInBackward(optimizer, every)


def _several_ranks():
    distributed = torch.distributed
    return (distributed.is_available() and distributed.is_initialized()
            and distributed.get_world_size() > 1)


def _before_step(optimizer):
    """The step's first part (settings from param_groups into the engine), at the pass's first
    gradient; the engine the hooks drive must stay the one they were made over."""
    if optimizer._params_changed():
        raise RuntimeError(f"{type(optimizer).__name__}: param_groups' tensors changed since "
                           "step_in_backward hooked them; call remove() on its handle and "
                           "step_in_backward(optimizer) again")
    optimizer._begin_step()
