"""One rank of python/tests/test_distributed.py: started N times, each with RANK, WORLD_SIZE and
INIT_FILE (a file:// rendezvous, which every torch from 1.13 on has, with or without libuv).

    python distributed_ranks.py ALGORITHM STEPS OUT_DIR
    python distributed_ranks.py swap:ALGORITHM STEPS OUT_DIR
    python distributed_ranks.py killed 0 OUT_DIR
    python distributed_ranks.py ends-after-step 0 OUT_DIR
    python distributed_ranks.py dcp-save:ALGORITHM STEPS OUT_DIR
    python distributed_ranks.py dcp-load:ALGORITHM STEPS OUT_DIR

Every rank steps the same parameters with the same gradients twice: once through the optimizer
with the process group (each rank updating what it owns) and once through the one-process
optimizer, the reference. It writes OUT_DIR/rank<r>.json: the largest relative difference of the
parameters after each step, of the gathered state dict, and of a run resumed at world size N from
the one-process state dict halfway; `swap:` puts a new tensor in the place of the first parameter
before the second step, on every rank and in the one process. `killed`: the last rank exits mid-run and the others write
what their next step raised. `ends-after-step`: each rank steps Muon and AdamW once and ends there,
as a script may, with no destroy_process_group. `dcp-save` runs the first half of the steps and saves model and
optimizer with torch.distributed.checkpoint (get_optimizer_state_dict); `dcp-load`, at any world
size, loads that checkpoint (set_optimizer_state_dict), runs the second half and writes how far
the parameters are from the one-process run that never stopped."""

import datetime
import faulthandler
import json
import os
import sys
import time

import torch
import torch.distributed as dist

import muon_cpp

TIMEOUT_S = 10  # the process group's: how long a rank waits for the others
# (64, 256): large enough for int8 state whole and in each of 4 ranks' rows (16 × 256).
SHAPES = [(24, 16), (16, 24), (24, 16), (8, 8), (3, 12, 12), (40, 8), (64, 256), (16,), (5,)]


# Clipping (the gradients' norm is about 45) and QK-clip (QkLogits's heads 0 and 2) every step,
# and a schedule, which torch.distributed.checkpoint's state-making step at lr 0 would trip.
HYBRID_CONFIG = {"optimizer": {"name": "muon", "lr": 0.02, "adamw_lr": 0.01,
                                "weight_decay": 0.01, "grad_clip": 10.0, "qk_clip": {"tau": 40.0},
                                "schedule": {"name": "cosine", "warmup_steps": 2}}}


class QkLogits:
    """QK-clip's source for the hybrid: an attention layer whose query and key weights are
    parameters 0 and 2 (4 heads of 6 rows each), with fixed per-head max logits. `share`: the part
    of them this rank saw (the max over ranks, rank 0's, is what one process sees)."""

    def __init__(self, params, share):
        self.params, self.share = params, share

    def qk_clip_targets(self):
        return [{"layer": "attn", "q_weight": self.params[0], "k_weight": self.params[2],
                 "n_heads": 4, "n_kv_heads": 4, "head_dim": 6}]

    def qk_max_logits(self):
        return {"attn": torch.tensor([50.0, 5.0, 80.0, 1.0]) * self.share}


def make(algorithm, params, group):
    if algorithm == "hybrid":  # the model's parameters by name, as build_optimizer routes them
        named = [(f"layers.{i}.weight", p) for i, p in enumerate(params)]
        optimizer = muon_cpp.build_optimizer(named, HYBRID_CONFIG, 100, process_group=group,
                                             timeout=TIMEOUT_S)
        ranks = group is not None or hasattr(params[0], "placements")  # DDP's, or FSDP2's shards
        optimizer.set_qk_clip_source(QkLogits(params, 0.5 if ranks and dist.get_rank() else 1.0))
        return optimizer
    extra = {} if group is None else {"process_group": group}
    matrices = [p for p in params if p.dim() >= 2]
    others = [p for p in params if p.dim() < 2]
    if algorithm == "aux_adam":  # KellerJordan/Muon's groups
        return muon_cpp.MuonWithAuxAdam(
            [dict(params=matrices, use_muon=True, weight_decay=0.01),
             dict(params=others, use_muon=False, lr=1e-2)], **extra)
    if algorithm == "muon":
        return muon_cpp.Muon(matrices, lr=0.02, weight_decay=0.01, **extra)
    if algorithm == "dion":
        return muon_cpp.Dion(matrices, lr=0.01, rank_fraction=0.5, **extra)
    if algorithm == "adamw_int8":  # int8 moments for the (64, 256) matrix, float32 elsewhere
        extra["state_dtype"] = "int8"
        algorithm = "adamw"
    cls = {"adamw": muon_cpp.AdamW, "lamb": muon_cpp.Lamb, "lion": muon_cpp.Lion}[algorithm]
    groups = [{"params": matrices}, {"params": others, "weight_decay": 0.0}]
    return cls(groups, lr=1e-2, **extra)


def parameters(seed):
    generator = torch.Generator().manual_seed(seed)
    return [torch.randn(shape, generator=generator).requires_grad_() for shape in SHAPES]


def set_gradients(params, step, rank=None, world=1):
    """The step's gradients: the same on every rank, or (hybrid, which averages them itself)
    rank `rank`'s own — for rank None, the mean of the `world` ranks' ones."""
    ranks = [rank] if rank is not None else range(world) if world > 1 else [0]
    for i, p in enumerate(params):
        grads = [torch.randn(p.shape, generator=torch.Generator().manual_seed(
            1000 + 100 * step + 10 * r + i)) for r in ranks]
        p.grad = torch.stack(grads).mean(0) if len(grads) > 1 else grads[0]


def relative_difference(a, b):
    return ((a - b).abs().max() / b.abs().max().clamp_min(1e-30)).item()


def state_difference(ours, reference):
    if sorted(ours["state"]) != sorted(reference["state"]):
        return float("inf")
    worst = 0.0
    for index, entry in reference["state"].items():
        for key, value in entry.items():
            mine = ours["state"][index][key]
            if isinstance(value, torch.Tensor) and value.is_floating_point():
                worst = max(worst, relative_difference(mine.float(), value.float()))
            elif (mine != value) if not isinstance(value, torch.Tensor) else not torch.equal(
                    mine, value):
                return float("inf")
    return worst


def swap_first(optimizer, params):
    """Puts a copy of params[0] (a new tensor) in its place in the optimizer's param_groups and in
    `params`, as accelerate's switch to sharded parameters does: stepped from fresh state on."""
    old = params[0]
    params[0] = old.detach().clone().requires_grad_()
    for group in optimizer.param_groups:
        group["params"] = [params[0] if p is old else p for p in group["params"]]


def snapshot(optimizer, params):
    """Copies of `params` and of `optimizer`'s state dict, to resume from later."""
    saved = optimizer.state_dict()
    saved["state"] = {i: {k: v.clone() if isinstance(v, torch.Tensor) else v
                          for k, v in entry.items()}
                      for i, entry in saved["state"].items()}
    return [p.detach().clone() for p in params], saved


def killed(out_dir, rank, optimizer, set_step_gradients):
    """The last rank exits before its second step; the others report what their step raised and
    how long it took. `set_step_gradients(step)` gives the parameters a step's gradients."""
    set_step_gradients(0)
    optimizer.step()
    set_step_gradients(1)  # before the last rank leaves: under FSDP2 it is a collective
    if rank == dist.get_world_size() - 1:
        os._exit(0)
    start = time.monotonic()
    try:
        optimizer.step()
        error = None
    except RuntimeError as e:
        error = str(e)
    with open(os.path.join(out_dir, f"rank{rank}.json"), "w", encoding="utf-8") as f:
        json.dump({"error": error, "seconds": time.monotonic() - start}, f)
    os._exit(0)  # the group is broken: no orderly shutdown


def ends_after_step(group):
    """One step of Muon and AdamW over `group`, then the end of the script, the main thread keeping
    the GIL to the end (a long switch interval): the interpreter exits while the backend's worker
    threads release what the last collectives held, which must need no GIL."""
    params = parameters(0)
    set_gradients(params, 0)
    muon = make("muon", params, group)
    adamw = muon_cpp.AdamW([p for p in params if p.dim() < 2], lr=1e-2, process_group=group)
    sys.setswitchinterval(60)
    muon.step()
    adamw.step()


def holder(params):
    """A module owning `params` (as p0, p1, ...): the names torch.distributed.checkpoint keys by."""
    module = torch.nn.Module()
    for i, p in enumerate(params):
        module.register_parameter(f"p{i}", torch.nn.Parameter(p.detach().clone()))
    return module


def checkpoint_phase(phase, model, optimizer, steps, out_dir, set_step_gradients):
    """dcp-save: the first half of the steps, then `model` and `optimizer` saved with
    torch.distributed.checkpoint; dcp-load: both loaded from there, then the second half.
    `set_step_gradients(step)` gives the parameters a step's gradients."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import (get_optimizer_state_dict,
                                                         set_optimizer_state_dict)
    path = os.path.join(out_dir, "checkpoint")
    if phase == "dcp-save":
        steps_run = range(steps // 2)
    else:
        state = {"model": model.state_dict(),
                 "optim": get_optimizer_state_dict(model, optimizer)}
        dcp.load(state, checkpoint_id=path)
        model.load_state_dict(state["model"])
        set_optimizer_state_dict(model, optimizer, state["optim"])
        steps_run = range(steps // 2, steps)
    for step in steps_run:
        set_step_gradients(step)
        optimizer.step()
    if phase == "dcp-save":
        dcp.save({"model": model.state_dict(),
                  "optim": get_optimizer_state_dict(model, optimizer)}, checkpoint_id=path)


def one_process_run(algorithm, steps):
    """The parameters after `steps` steps of the one-process optimizer: the reference."""
    alone = parameters(0)
    reference = make(algorithm, alone, None)
    for step in range(steps):
        set_gradients(alone, step)
        reference.step()
    return alone


def checkpoint(phase, algorithm, steps, out_dir, rank):
    """dcp-save / dcp-load (see the module's docstring)."""
    model = holder(parameters(0))
    params = list(model.parameters())
    optimizer = make(algorithm, params, dist.group.WORLD)
    checkpoint_phase(phase, model, optimizer, steps, out_dir,
                     lambda step: set_gradients(params, step))
    if phase == "dcp-save":
        return
    alone = one_process_run(algorithm, steps)
    report = {"resumed": max(relative_difference(a.detach(), b.detach())
                             for a, b in zip(params, alone))}
    with open(os.path.join(out_dir, f"rank{rank}.json"), "w", encoding="utf-8") as f:
        json.dump(report, f)


def start_rank():
    """This rank's process group (Gloo, file:// rendezvous) and arguments: (algorithm, steps,
    out_dir, rank, world)."""
    # A rank that hangs prints where, and exits, well before the test gives up on it.
    faulthandler.dump_traceback_later(6 * TIMEOUT_S, exit=True)
    algorithm, steps, out_dir = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    dist.init_process_group("gloo", init_method="file://" + os.environ["INIT_FILE"], rank=rank,
                            world_size=world, timeout=datetime.timedelta(seconds=TIMEOUT_S))
    return algorithm, steps, out_dir, rank, world


def main():
    algorithm, steps, out_dir, rank, world = start_rank()
    if algorithm == "killed":
        params = parameters(0)
        killed(out_dir, rank, make("muon", params, dist.group.WORLD),
               lambda step: set_gradients(params, step))
    if algorithm == "ends-after-step":
        ends_after_step(dist.group.WORLD)
        return
    if algorithm.startswith("dcp-"):
        phase, algorithm = algorithm.split(":")
        checkpoint(phase, algorithm, steps, out_dir, rank)
        dist.barrier()
        dist.destroy_process_group()
        # torch.distributed.checkpoint's collectives are torch.distributed's own, with tensors
        # Python made, and a rank ending after them aborted during the interpreter's shutdown
        # ("terminate called without an active exception": 1 save in 70 with torch 2.15) — as a
        # Gloo worker releasing such a tensor then would (docs/distributed.md). Everything this
        # rank writes is written and closed: leave without that shutdown.
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)
    group = dist.group.WORLD
    swapping = algorithm.startswith("swap:")
    algorithm = algorithm.split(":")[-1]
    shared, alone = parameters(0), parameters(0)
    ours, reference = make(algorithm, shared, group), make(algorithm, alone, None)
    report = {"rank": rank, "owned": [], "steps": [], "state": None, "resumed": None}
    report["owned"] = [ours._owns(p) for p in ours._params()]
    own = rank if algorithm == "hybrid" else None  # the hybrid averages the ranks' gradients
    halfway = None
    for step in range(steps):
        if swapping and step == 1:  # the same change on every rank and in the one process
            swap_first(ours, shared)
            swap_first(reference, alone)
        set_gradients(shared, step, own, world)
        set_gradients(alone, step, None, world)
        ours.step()
        reference.step()
        report["steps"].append(max(relative_difference(a.detach(), b.detach())
                                   for a, b in zip(shared, alone)))
        if step == steps // 2 - 1:  # the one-process run's parameters and state, copied
            halfway = snapshot(reference, alone)
    report["state"] = state_difference(ours.state_dict(), reference.state_dict())
    # Resume at this world size from the one-process state dict saved halfway.
    values, saved = halfway
    resumed_params = [v.clone().requires_grad_() for v in values]
    resumed = make(algorithm, resumed_params, group)
    resumed.load_state_dict(saved)
    for step in range(steps // 2, steps):
        set_gradients(resumed_params, step, own, world)
        resumed.step()
    report["resumed"] = max(relative_difference(a.detach(), b.detach())
                            for a, b in zip(resumed_params, alone))
    with open(os.path.join(out_dir, f"rank{rank}.json"), "w", encoding="utf-8") as f:
        json.dump(report, f)
    del ours, resumed  # the hybrid's C++ communicators hold the group: released first
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
