"""Data parallelism for muon_cpp's optimizers over a torch.distributed process group
(docs/distributed.md): each parameter has one owner rank, chosen by the plan the C++ hybrid's data
parallelism uses (``_core.owner_plan``: matrices by their orthogonalization cost, other tensors by
size, largest first, each to the least-loaded rank). The owner alone keeps the parameter's state
and computes its update; then every owner broadcasts its new values to the group, one message per
owner and dtype.

The collectives run in C++ (``_core.Collectives``), not through torch.distributed's functions:
there the backend holds only tensors no Python object owns, and a script that ends right after a
step cannot abort while the backend's worker thread releases them (recent PyTorch frees a tensor
Python made only with the GIL, which an exiting interpreter no longer grants)."""

import ctypes
import pickle

import torch
import torch.distributed as dist

from . import _core


def global_rank(group, group_rank):
    """The global rank of ``group_rank`` in ``group`` (torch 1.13 names the function privately)."""
    if group is None or group is dist.group.WORLD:
        return group_rank
    get = getattr(dist, "get_global_rank", None) or dist.distributed_c10d._get_global_rank
    return get(group, group_rank)


def check_group(group):
    """Raises unless ``group`` can be used: torch.distributed initialized, this process a member."""
    if not dist.is_available() or not dist.is_initialized():
        raise ValueError("process_group: torch.distributed is not initialized; call "
                         "torch.distributed.init_process_group first (or give None)")
    if dist.get_rank(group) < 0:
        raise ValueError("process_group: this process is not a member of the group")


def collective(what, members, run, *args, **kwargs):
    """Runs a collective of the group ``members``; a failure (a rank exited, hung past the group's
    timeout, or disagreed) becomes a RuntimeError that says so, naming this rank. Returns what
    ``run`` returns."""
    try:
        return run(*args, **kwargs)
    except RuntimeError as e:
        raise RuntimeError(f"muon_cpp: {what} failed on rank {dist.get_rank(members)} of "
                           f"{dist.get_world_size(members)}: {e} — another rank exited, hung past "
                           "the process group's timeout, or called step() with other "
                           "parameters") from e


def gather_state(local, group):
    """The union of every rank's ``local`` {index: state} (each index on one rank only), as CPU
    copies, sorted by index."""
    cpu = {i: {k: v.cpu() if isinstance(v, torch.Tensor) else v for k, v in entry.items()}
           for i, entry in local.items()}
    everyone = collective("state_dict()'s gathering of the state", group, all_gather_objects,
                          _core.Collectives(group), group, cpu)
    merged = {}
    for part in everyone:
        merged.update(part)
    return dict(sorted(merged.items()))


def all_gather_objects(collectives, group, value):
    """Every rank's picklable ``value``, in rank order (torch.distributed.all_gather_object's
    result): the lengths of the pickles, then the pickles padded to the longest."""
    world = dist.get_world_size(group)
    device = collectives.device  # the backend's: the CPU, or an NCCL group's GPU
    mine = torch.frombuffer(bytearray(pickle.dumps(value)), dtype=torch.uint8)
    lengths = torch.empty(world, dtype=torch.int64, device=device)
    collectives.all_gather(torch.tensor([mine.numel()], device=device), lengths)
    longest = int(lengths.max())
    padded = torch.zeros(longest, dtype=torch.uint8, device=device)
    padded[:mine.numel()] = mine
    pickles = torch.empty(world * longest, dtype=torch.uint8, device=device)
    collectives.all_gather(padded, pickles)
    pickles = pickles.cpu()
    return [pickle.loads(ctypes.string_at(pickles[r * longest:].data_ptr(), length))
            for r, length in enumerate(lengths.tolist())]


class OwnerPlan:
    """Which rank of ``group`` owns each of ``params`` (the same on every rank, which must pass the
    same parameters in the same order); ``matrices``: whether they are updated as matrices (Muon,
    Dion) or element by element — one bool for all, or one per parameter."""

    def __init__(self, params, matrices, group):
        check_group(group)
        self.group = group
        self.world = dist.get_world_size(group)
        self.rank = dist.get_rank(group)
        if isinstance(matrices, bool):
            matrices = [matrices] * len(params)
        owners = _core.owner_plan([(list(p.shape), m) for p, m in zip(params, matrices)],
                                  self.world)
        self._owner = {id(p): r for p, r in zip(params, owners)}
        self.collectives = _core.Collectives(group)

    def owner(self, p):
        return self._owner[id(p)]

    def owns(self, p):
        return self._owner[id(p)] == self.rank

    def share(self, params):
        """Every parameter's values from its owner to every rank of the group."""
        for owner in range(self.world):
            by_dtype = {}
            for p in params:
                if self._owner[id(p)] == owner:
                    by_dtype.setdefault((p.dtype, p.device), []).append(p)
            for same in by_dtype.values():
                flat = torch.cat([p.detach().reshape(-1) for p in same])
                collective(f"the broadcast of rank {owner}'s parameters", self.group,
                           self.collectives.broadcast, flat, owner)
                if owner != self.rank:
                    with torch.no_grad():
                        offset = 0
                        for p in same:
                            p.copy_(flat[offset:offset + p.numel()].view_as(p))
                            offset += p.numel()

    def gather_state(self, local):
        return gather_state(local, self.group)
