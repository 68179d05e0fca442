"""One rank of python/tests/test_fsdp.py: started N times, each with RANK, WORLD_SIZE and
INIT_FILE (a file:// rendezvous), as distributed_ranks.py is.

    python fsdp_ranks.py ALGORITHM STEPS OUT_DIR
    python fsdp_ranks.py dcp-save:ALGORITHM STEPS OUT_DIR
    python fsdp_ranks.py dcp-load:ALGORITHM STEPS OUT_DIR
    python fsdp_ranks.py killed 0 OUT_DIR
    python fsdp_ranks.py accelerate:ALGORITHM STEPS OUT_DIR
    python fsdp_ranks.py int8-shards 0 OUT_DIR

The parameters of distributed_ranks.py, held by a module that FSDP2's fully_shard shards over the
ranks (DTensors, Shard(0); some ranks hold no rows of the smallest), are stepped by ALGORITHM's
optimizer with Shard(0) gradients, while one process steps an unsharded copy with the same whole
gradients: the reference. It writes OUT_DIR/rank<r>.json: the largest relative difference of the
whole parameters after each step, of the state dict, and of a sharded run resumed from the
one-process state dict halfway. `dcp-save` runs the first half of the steps on the sharded module
and saves module and optimizer with torch.distributed.checkpoint (get_optimizer_state_dict);
`dcp-load`, at any world size, loads them (set_optimizer_state_dict), runs the second half and
writes how far the whole parameters are from the one-process run that never stopped. `killed`:
the last rank exits mid-run and the others write what their next step raised. `int8-shards`:
AdamW with int8 state over a (2, 3000) parameter, which keeps int8 state whole but not in one
row; each rank writes what building the optimizer raised."""

import gc
import json
import os

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import Shard, distribute_tensor

from distributed_ranks import (QkLogits, checkpoint_phase, holder, killed, make,
                               one_process_run, parameters, relative_difference, set_gradients,
                               snapshot, start_rank, state_difference)


def sharded(values, mesh):
    """A module holding copies of `values`, sharded by fully_shard: its parameters, DTensors."""
    module = holder(values)
    fully_shard(module, mesh=mesh)
    return list(module.parameters())


def set_sharded_gradients(params, step, mesh):
    """The step's gradients (distributed_ranks.set_gradients'), each rank given its rows."""
    whole = [torch.empty(p.shape) for p in params]
    set_gradients(whole, step)
    for p, w in zip(params, whole):
        p.grad = distribute_tensor(w.grad, mesh, [Shard(0)])


def difference(params, alone):
    return max(relative_difference(p.full_tensor().detach(), a.detach())
               for p, a in zip(params, alone))


def checkpoint(phase, algorithm, steps, out_dir, mesh):
    """dcp-save / dcp-load (see the module's docstring); dcp-load returns its report."""
    module = holder(parameters(0))
    fully_shard(module, mesh=mesh)
    params = list(module.parameters())
    optimizer = make(algorithm, params, None)
    checkpoint_phase(phase, module, optimizer, steps, out_dir,
                     lambda step: set_sharded_gradients(params, step, mesh))
    if phase == "dcp-save":
        return None
    return {"resumed": difference(params, one_process_run(algorithm, steps))}


def step_beside(ours, reference, shards, alone, step, mesh):
    """One step of the sharded run and of the one-process run, from the same gradients: how far
    the whole parameters are apart after it."""
    set_sharded_gradients(shards, step, mesh)
    set_gradients(alone, step)
    ours.step()
    reference.step()
    return difference(shards, alone)


def run(algorithm, steps, mesh):
    """The sharded run beside the one-process run (see the module's docstring): its report."""
    shards, alone = sharded(parameters(0), mesh), parameters(0)
    ours, reference = make(algorithm, shards, None), make(algorithm, alone, None)
    report = {"rows": [tuple(p.to_local().shape) for p in shards],
              "owned": [ours._owns(p) for p in ours._params()], "steps": []}
    halfway = None
    for step in range(steps):
        report["steps"].append(step_beside(ours, reference, shards, alone, step, mesh))
        if step == steps // 2 - 1:  # the one-process run's parameters and state, copied
            halfway = snapshot(reference, alone)
    report["state"] = state_difference(ours.state_dict(), reference.state_dict())
    values, saved = halfway
    resumed_params = sharded(values, mesh)
    resumed = make(algorithm, resumed_params, None)
    resumed.load_state_dict(saved)
    for step in range(steps // 2, steps):
        set_sharded_gradients(resumed_params, step, mesh)
        resumed.step()
    report["resumed"] = difference(resumed_params, alone)
    return report


def accelerate_switch(algorithm, steps, mesh):
    """accelerate's prepare under FSDP2, step by step as accelerate 1.16 takes them
    (accelerate/accelerator.py, _prepare_fsdp2; utils/fsdp_utils.py,
    fsdp2_switch_optimizer_parameters): the optimizer built over the plain module; its state dict
    loaded back into it (AcceleratedOptimizer moving state to the device); each tensor in
    param_groups replaced by a placeholder carrying the parameter's data_ptr; fully_shard; then
    every group's params a new list of the module's DTensors, looked up by that key. Then the
    steps, beside one process's: the report of run()."""
    module = holder(parameters(0))
    ours = make(algorithm, list(module.parameters()), None)
    ours.load_state_dict(ours.state_dict())
    key_of = {name: p.data_ptr() for name, p in module.named_parameters()}
    for group in ours.param_groups:
        for i, p in enumerate(group["params"]):
            placeholder = torch.empty(1, dtype=p.dtype, device=p.device)
            placeholder.data_ptr = p.data_ptr()  # accelerate's key, an int in the method's place
            group["params"][i] = placeholder
    fully_shard(module, mesh=mesh)
    sharded_of = {key_of[name]: p for name, p in module.named_parameters()}
    for group in ours.param_groups:
        group["params"] = [sharded_of[p.data_ptr] for p in group["params"]]
    shards, alone = list(module.parameters()), parameters(0)
    if algorithm == "hybrid":  # the model's attention now holds the DTensors
        ours.set_qk_clip_source(QkLogits(shards, 0.5 if dist.get_rank() else 1.0))
    reference = make(algorithm, alone, None)
    report = {"steps": [step_beside(ours, reference, shards, alone, step, mesh)
                        for step in range(steps)]}
    report["owned"] = [ours._owns(p) for p in ours._params()]
    report["state"] = state_difference(ours.state_dict(), reference.state_dict())
    return report


def main():
    algorithm, steps, out_dir, rank, world = start_rank()
    mesh = init_device_mesh("cpu", (world,))
    if algorithm == "killed":
        params = sharded(parameters(0), mesh)
        killed(out_dir, rank, make("muon", params, None),
               lambda step: set_sharded_gradients(params, step, mesh))
    if algorithm == "int8-shards":
        param = sharded([torch.zeros(2, 3000)], mesh)[0]
        try:
            import muon_cpp
            muon_cpp.AdamW([param], state_dtype="int8")
            report = {"error": None}
        except ValueError as e:
            report = {"error": str(e)}
    elif algorithm.startswith("dcp-"):
        phase, algorithm = algorithm.split(":")
        report = checkpoint(phase, algorithm, steps, out_dir, mesh)
    elif algorithm.startswith("accelerate:"):
        report = accelerate_switch(algorithm.split(":")[1], steps, mesh)
    else:
        report = run(algorithm, steps, mesh)
    if report is not None:
        with open(os.path.join(out_dir, f"rank{rank}.json"), "w", encoding="utf-8") as f:
            json.dump(report, f)
    # The sharded modules (gone with run() and checkpoint(), but in reference cycles) keep Gloo's
    # work objects; freed at exit, after the group is destroyed, they can abort the process
    # (examples/python/fsdp_muon.py says more). Freed here, while the group lives.
    gc.collect()
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
