"""Parameters sharded by FSDP2 (``fully_shard``: DTensors placed ``Shard(0)`` on a 1-D device
mesh) for muon_cpp's optimizers (docs/distributed.md §Python: parameters sharded by FSDP2).

An elementwise algorithm (AdamW, Adam, Lion) updates each rank's rows where they lie: the engine
is given the local shards, and one rank's rows get exactly what one process would give them. Muon,
Dion and Lamb need the whole tensor (an orthogonalization, a trust ratio over all of it): each such
parameter has an owner rank (the data parallelism's plan, muon_cpp._distributed.OwnerPlan) that
gathers the parameter's and its gradient's rows, updates the whole tensor as one process would,
keeps its state, and scatters the new rows back to the ranks that hold them."""

import math
import warnings

import torch
import torch.distributed as dist

from . import _core
from ._distributed import OwnerPlan, collective, global_rank


def _dtensor_type():
    """torch's DTensor class, or None where this torch has none (1.13)."""
    try:
        from torch.distributed.tensor import DTensor
    except ImportError:
        try:
            from torch.distributed._tensor import DTensor
        except ImportError:
            return None
    return DTensor


def is_sharded(p):
    """Whether ``p`` is a DTensor (a parameter FSDP2 sharded)."""
    if type(p) in (torch.Tensor, torch.nn.Parameter):
        return False
    dtensor = _dtensor_type()
    return dtensor is not None and isinstance(p, dtensor)


def local(t):
    """This rank's rows of the DTensor ``t``: a view of the memory it holds, which writes reach."""
    with torch.no_grad():
        return t.to_local()


def row_split(total, world, rank):
    """(first row, row count) of ``rank``'s shard of ``total`` rows, as Shard(0) splits them
    (torch.chunk: ⌈total / world⌉ rows per rank, the last ranks' fewer or none)."""
    per = -(-total // world)
    first = min(total, rank * per)
    return first, min(total, first + per) - first


class ShardedParams:
    """The parameters of one optimizer, all sharded by FSDP2 on one mesh, and the tensors its
    engine updates in their place: the local shards (``whole`` False), or (``whole`` True) a whole
    buffer for each parameter this rank owns and a stand-in of the parameter's shape, holding no
    memory, for the rest (the engine sees every parameter, so each keeps the position one process
    gives it: the seed of its stochastic rounding and of Dion's first Q). ``matrices``: whether
    owners are planned by orthogonalization cost (Muon, Dion) or by size — one bool for all, or
    one per parameter."""

    def __init__(self, params, whole, matrices, process_group, who):
        self._check(params, who)
        self.params = list(params)
        mesh = params[0].device_mesh
        self.group = mesh.get_group()
        if process_group is not None and _ranks(process_group) != _ranks(self.group):
            raise ValueError(f"{who}: process_group holds ranks {_ranks(process_group)}, the "
                             f"parameters' device mesh {_ranks(self.group)}; give the mesh's "
                             "group or None (DTensor parameters bring their group)")
        self.world = dist.get_world_size(self.group)
        self.rank = dist.get_rank(self.group)
        for i, p in enumerate(params):
            rows = row_split(p.shape[0], self.world, self.rank)[1]
            if tuple(local(p).shape) != (rows,) + tuple(p.shape[1:]):
                raise ValueError(f"{who}: parameter {i} of shape {tuple(p.shape)} holds rows of "
                                 f"shape {tuple(local(p).shape)} on rank {self.rank}; Shard(0) "
                                 f"over {self.world} ranks gives {rows} rows (torch.chunk's "
                                 "split), which muon_cpp expects")
        self._collectives = _core.Collectives(self.group)
        # One rank holds every row: its shards are the whole tensors.
        self._plan = OwnerPlan(params, matrices, self.group) if whole and self.world > 1 else None
        self._local = {id(p): local(p) for p in params}
        self._engine = {}
        for p in params:
            held = self._local[id(p)]
            if self._plan is None:
                self._engine[id(p)] = held
            elif self._plan.owns(p):
                self._engine[id(p)] = torch.empty(p.shape, dtype=p.dtype, device=held.device)
            else:
                self._engine[id(p)] = torch.zeros((), dtype=p.dtype,
                                                  device=held.device).expand(p.shape)

    def check_int8_state(self, groups, who):
        """Each rank updates its own rows: a parameter that keeps int8 state whole must keep it
        on every rank's rows too (blocks lie within rows, but the 4096-element threshold counts
        a shard's elements), or its state would differ in kind between ranks and world sizes."""
        index = {id(p): i for i, p in enumerate(self.params)}
        for group in groups:
            if str(group.get("state_dtype")) not in ("int8", "torch.int8"):
                continue
            for p in group["params"]:
                whole = _core.takes_int8_state(list(p.shape))
                for rank in range(self.world):
                    rows = row_split(p.shape[0], self.world, rank)[1]
                    shard = [rows] + list(p.shape[1:])
                    if _core.takes_int8_state(shard) != whole:
                        raise ValueError(
                            f"{who}: parameter {index[id(p)]} of shape {tuple(p.shape)} "
                            f"{'keeps' if whole else 'does not keep'} int8 state whole, but "
                            f"its rows on rank {rank} of {self.world} ({tuple(shard)}) "
                            f"{'do not' if whole else 'do'} (int8 state needs 4096+ elements in "
                            "2+ dims); give it a param group with state_dtype float32")

    @staticmethod
    def _check(params, who):
        sharded = [is_sharded(p) for p in params]
        if not all(sharded):
            raise ValueError(f"{who}: {sum(sharded)} of the {len(params)} parameters are DTensors "
                             "(FSDP2's fully_shard) and the others plain tensors; shard the whole "
                             "model (fully_shard on its root too) or give the DTensors an "
                             "optimizer of their own")
        mesh = params[0].device_mesh
        for i, p in enumerate(params):
            if p.device_mesh != mesh:
                raise ValueError(f"{who}: parameter {i} lives on another device mesh than "
                                 "parameter 0; give one optimizer the parameters of one mesh")
            if mesh.ndim != 1:
                raise ValueError(f"{who}: parameter {i} lives on a {mesh.ndim}-D device mesh; "
                                 "muon_cpp takes parameters sharded over a 1-D mesh (fully_shard's "
                                 "default), not HSDP's 2-D one")
            if len(p.placements) != 1 or not p.placements[0].is_shard(0):
                raise ValueError(f"{who}: parameter {i} is placed {tuple(p.placements)}; muon_cpp "
                                 "takes Shard(0), as fully_shard places parameters")

    def engine_tensor(self, p):
        """The tensor the engine updates for ``p``."""
        return self._engine[id(p)]

    def owns(self, p):
        """Whether this rank updates ``p`` (its rows, or the whole tensor) and keeps its state."""
        return self._plan is None or self._plan.owns(p)

    def owner(self, p):
        """The rank that updates the whole ``p`` (``whole``; this rank where one holds all rows)."""
        return self.rank if self._plan is None else self._plan.owner(p)

    @property
    def owners_hold_state(self):
        """Whether each parameter's state is on one rank (whole tensors), not spread over all."""
        return self._plan is not None

    def step(self, params, run):
        """``run()`` (the engine's step) with the engine's tensors holding the parameters and
        gradients it needs; then the new rows reach their ranks."""
        with torch.no_grad():
            stepped = [p for p in params if p.grad is not None]
            for p in stepped:
                self._check_held(p)
            by_owner = {}
            for p in stepped:
                if self._plan is None:
                    self.engine_tensor(p).grad = self._rows_of_grad(p)
                else:
                    by_owner.setdefault(self._plan.owner(p), []).append(p)
            for owner, owned in sorted(by_owner.items()):
                self._gather(owner, owned)
            try:
                run()
            finally:
                for p in stepped:
                    self.engine_tensor(p).grad = None
            for owner, owned in sorted(by_owner.items()):
                self._scatter(owner, owned)

    def _check_held(self, p):
        now, held = local(p), self._local[id(p)]
        if now.data_ptr() != held.data_ptr() or now.shape != held.shape:
            raise RuntimeError("a sharded parameter's local tensor was replaced after the "
                               "optimizer was built (fully_shard or .to() again?); build the "
                               "optimizer after the model's last move")

    def _rows_of_grad(self, p):
        grad = p.grad
        if not is_sharded(grad):
            raise RuntimeError("a DTensor parameter's .grad is a plain tensor; FSDP2 gives "
                               "DTensor gradients (Shard(0))")
        if len(grad.placements) != 1 or not grad.placements[0].is_shard(0):
            raise RuntimeError(f"a gradient is placed {tuple(grad.placements)}; muon_cpp takes "
                               "Shard(0) gradients, as FSDP2 reduce-scatters them")
        return local(grad)

    def _gather(self, owner, params):
        """Every rank's rows of ``params`` and of their gradients into ``owner``'s whole copies:
        one message per rank and dtype."""
        pieces = []  # (rows here, the whole tensor they go into on the owner or None)
        for p in params:
            whole = self.engine_tensor(p) if owner == self.rank else None
            grad_rows = self._rows_of_grad(p)
            grad = None if whole is None else torch.empty(p.shape, dtype=grad_rows.dtype,
                                                          device=whole.device)
            pieces += [(self._local[id(p)], p.shape, whole), (grad_rows, p.shape, grad)]
            if whole is not None:
                whole.grad = grad
        for same in _by_dtype(pieces):
            sent = torch.cat([self._padded(rows, shape[0]).reshape(-1) for rows, shape, _ in same])
            parts = [] if owner != self.rank else [torch.empty_like(sent)
                                                   for _ in range(self.world)]
            collective("the gathering of sharded parameters to their owner", self.group,
                       self._collectives.gather, sent, parts, owner)
            if parts:
                offset = 0
                for _, shape, whole in same:
                    size = self._padded_numel(shape)
                    rows = [part[offset:offset + size].view(-1, *shape[1:]) for part in parts]
                    whole.copy_(torch.cat(rows)[:shape[0]])
                    offset += size

    def _scatter(self, owner, params):
        """``owner``'s new values of ``params`` back into every rank's rows: one message per rank
        and dtype."""
        pieces = [(self._local[id(p)], p.shape, self.engine_tensor(p)) for p in params]
        for same in _by_dtype(pieces):
            received = same[0][0].new_empty(sum(self._padded_numel(shape) for _, shape, _ in same))
            parts = []
            if owner == self.rank:
                parts = [torch.cat([self._padded(whole[first:first + count], shape[0]).reshape(-1)
                                    for _, shape, whole in same
                                    for first, count in [row_split(shape[0], self.world, r)]])
                         for r in range(self.world)]
            collective("the scattering of sharded parameters from their owner", self.group,
                       self._collectives.scatter, received, parts, owner)
            offset = 0
            for held, shape, _ in same:
                size = self._padded_numel(shape)
                held.copy_(received[offset:offset + size].view(-1, *shape[1:])[:held.shape[0]])
                offset += size

    def _padded(self, rows, total):
        """``rows`` padded with zeros to ⌈total / world⌉ rows, the size every rank sends."""
        per = -(-total // self.world)
        if rows.shape[0] == per:
            return rows
        padded = rows.new_zeros((per,) + tuple(rows.shape[1:]))
        padded[:rows.shape[0]] = rows
        return padded

    def _padded_numel(self, shape):
        """The elements of one rank's padded rows of a tensor of ``shape``."""
        return -(-shape[0] // self.world) * math.prod(shape[1:])

    def whole_entry(self, p, entry):
        """``entry``, this rank's state of ``p``, as one process holds it: each tensor of the
        local rows' shape gathered into the whole parameter's shape (a collective over the mesh);
        whole tensors' state is already whole."""
        if self._plan is not None:
            return entry
        rows = local(p).shape
        out = {}
        for key, value in entry.items():
            # State by rows: the parameter's shape, or int8 state's scales (rows × blocks).
            if isinstance(value, torch.Tensor) and value.dim() >= 1 and value.shape[0] == rows[0]:
                padded = self._padded(value, p.shape[0]).contiguous()
                whole = padded.new_empty((self.world * padded.shape[0],) + padded.shape[1:])
                collective("state_dict()'s gathering of sharded state", self.group,
                           self._collectives.all_gather, padded.reshape(-1), whole.view(-1))
                value = whole[:p.shape[0]].cpu()
            out[key] = value
        return out

    def local_entry(self, p, entry):
        """A whole state ``entry`` of ``p`` (one process's, from state_dict()) cut to what this
        rank keeps: each tensor of the parameter's shape to this rank's rows."""
        if self._plan is not None:
            return entry
        first, count = row_split(p.shape[0], self.world, self.rank)
        return {key: value[first:first + count].clone()
                if isinstance(value, torch.Tensor) and value.dim() >= 1
                and value.shape[0] == p.shape[0] else value
                for key, value in entry.items()}


def sharded_hybrid(named, config_text, total_steps, process_group, timeout_s):
    """The hybrid's engine over FSDP2's shards, and its ShardedParams: routing reads stand-ins of
    the whole shapes; each parameter's owner rank updates the whole tensor (gathered, then
    scattered back, as for Muon alone: clipping and QK-clip need whole tensors); the gradient norm
    and QK-clip's logits are reduced over the mesh (the C++ set_partition)."""
    unique = list({id(p): p for _, p, _ in named}.values())  # a tied parameter once
    stand_in = {id(p): torch.empty(p.shape, dtype=p.dtype, device="meta")
                .requires_grad_(p.requires_grad) for p in unique}
    routed = [(name, stand_in[id(p)], kind) for name, p, kind in named]
    with warnings.catch_warnings():  # routing's warning comes once, from Engine.hybrid below
        warnings.simplefilter("ignore")
        roles = dict(_core.routed_roles(routed, config_text))
    role_of = {}
    for name, p, _ in named:  # a tied parameter routed under its first name
        role_of.setdefault(id(p), roles.get(name))
    # Frozen parameters keep their stand-ins: nothing updates them, so no rank holds them whole
    # (a model with nothing to train still plans them all, for the mesh's checks and group).
    planned = [p for p in unique if role_of[id(p)] != "frozen"] or unique
    shards = ShardedParams(planned, True, [role_of[id(p)] == "matrices" for p in planned],
                           process_group, "build_optimizer")
    held = {id(p): shards.engine_tensor(p) for p in planned}
    engine = _core.Engine.hybrid(routed, config_text, total_steps,
                                 [held.get(id(p), stand_in[id(p)]) for _, p, _ in named])
    engine.set_partition(shards.group, timeout_s,
                         [(held[id(p)], shards.owner(p)) for p in planned
                          if role_of[id(p)] != "frozen"])
    return engine, shards


class HeldQkClipSource:
    """A model's QK-clip source as the hybrid on FSDP2's shards reads it: each query and key weight
    (the model's DTensor) replaced by the tensor this rank's engine holds for it; the logits are
    this rank's, which the engine reduces over the mesh."""

    def __init__(self, source, shards):
        self._source = source
        self._shards = shards

    def qk_clip_targets(self):
        targets = []
        for target in self._source.qk_clip_targets():
            target = dict(target)
            for key in ("q_weight", "k_weight"):
                try:
                    target[key] = self._shards.engine_tensor(target[key])
                except KeyError:
                    raise ValueError(f"set_qk_clip_source: layer {target.get('layer')!r}'s {key} "
                                     "is not one of this optimizer's parameters") from None
            targets.append(target)
        return targets

    def qk_max_logits(self):
        return self._source.qk_max_logits()


def _by_dtype(pieces):
    """``pieces`` (tensor first) in groups of one dtype, in order: what one message can carry."""
    groups = {}
    for piece in pieces:
        groups.setdefault(piece[0].dtype, []).append(piece)
    return list(groups.values())


def _ranks(group):
    """The global ranks of ``group``."""
    get = getattr(dist, "get_process_group_ranks", None)
    if get is not None:
        return list(get(group))
    return [global_rank(group, r) for r in range(dist.get_world_size(group))]
