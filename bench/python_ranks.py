"""Step time of muon_cpp.Muon over a torch.distributed process group (DDP) and on parameters
sharded by FSDP2 at 1, 2 and 4 ranks, beside torch.optim.Muon and muon_cpp.Muon in one process,
in one run.

    python3 bench/python_ranks.py [--ranks 1,2,4] [--threads N] [--layers 4] [--width 512]
                                  [--steps 12] [--ns-dtype bfloat16|float32]
                                  [--sharding ddp,fsdp2] [--json FILE]

Under DDP every rank holds the same GPT-shaped matrices (per layer q, k, v, o of width², a SwiGLU
MLP of hidden size 4·width) with the same gradients, as after DDP's all-reduce; under FSDP2
(fully_shard, where torch has it) each rank holds its rows of them and of the same gradients,
as after FSDP2's reduce-scatter, and each matrix is gathered to its owner. Each world size is a
fresh set of ranks (processes, Gloo over a file:// rendezvous) that share the machine's --threads
cores (each rank max(1, threads / ranks) intra-op threads). A step's time is the slowest rank's
(a barrier before, the largest time over the ranks after), the median over --steps steps after
two warm-up steps. The one-process figures run in this process on all --threads threads, before
the ranks start; ratios are taken within the run. The parameters after the timed steps are
checked against the one-process muon_cpp.Muon's.
"""
import argparse
import datetime
import json
import os
import platform
import statistics
import sys
import tempfile
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

import muon_cpp

SETTINGS = dict(lr=0.02, momentum=0.95, weight_decay=0.01)
NS_DTYPES = {"bfloat16": torch.bfloat16, "float32": torch.float32}


def matrices(layers, width):
    hidden = 4 * width
    block = [(width, width)] * 4 + [(hidden, width)] * 2 + [(width, hidden)]
    return block * layers


def make_params(shapes):
    generator = torch.Generator().manual_seed(0)
    params = []
    for shape in shapes:
        p = torch.nn.Parameter(torch.randn(shape, generator=generator) * 0.02)
        p.grad = torch.randn(shape, generator=generator) * 1e-3
        params.append(p)
    return params


def step_times(optimizer, steps, barrier=None):
    """Milliseconds of each of `steps` steps after two warm-up steps; with `barrier`, the
    slowest rank's."""
    for _ in range(2):
        optimizer.step()
    times = []
    for _ in range(steps):
        if barrier:
            barrier()
        begin = time.perf_counter()
        optimizer.step()
        elapsed = torch.tensor([(time.perf_counter() - begin) * 1e3], dtype=torch.float64)
        if barrier:
            dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)
        times.append(elapsed.item())
    return times


def sharded(params, world):
    """Copies of `params` sharded by FSDP2 over `world` ranks, each given its rows of the
    gradient."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor import Shard, distribute_tensor
    mesh = init_device_mesh("cpu", (world,))
    module = torch.nn.Module()
    for i, p in enumerate(params):
        module.register_parameter(f"p{i}", torch.nn.Parameter(p.detach().clone()))
    fully_shard(module, mesh=mesh)
    out = list(module.parameters())
    for shard, p in zip(out, params):
        shard.grad = distribute_tensor(p.grad, mesh, [Shard(0)])
    return out


def rank_main(rank, world, sharding, args, init_file, out_dir):
    torch.set_num_threads(max(1, args.threads // world))
    dist.init_process_group("gloo", init_method="file://" + init_file, rank=rank,
                            world_size=world, timeout=datetime.timedelta(seconds=300))
    params = make_params(matrices(args.layers, args.width))
    if sharding == "fsdp2":
        params = sharded(params, world)
        group = None  # the device mesh's
    else:
        group = dist.group.WORLD
    optimizer = muon_cpp.Muon(params, **SETTINGS, ns_dtype=NS_DTYPES[args.ns_dtype],
                              process_group=group)
    times = step_times(optimizer, args.steps, dist.barrier)
    owned = sum(p.numel() * p.element_size() for p in params if optimizer._owns(p))
    final = [p.full_tensor() if sharding == "fsdp2" else p for p in params]  # a collective
    if rank == 0:
        torch.save([p.detach() for p in final], os.path.join(out_dir, f"params{world}.pt"))
    with open(os.path.join(out_dir, f"rank{rank}_of_{world}.json"), "w", encoding="utf-8") as f:
        json.dump({"median_ms": statistics.median(times), "owned_bytes": owned,
                   "threads": torch.get_num_threads()}, f)
    dist.barrier()
    dist.destroy_process_group()


def has_fsdp2():
    try:
        from torch.distributed.fsdp import fully_shard  # noqa: F401
        from torch.distributed.tensor import DTensor  # noqa: F401
    except ImportError:
        return False
    return True


def cpu_name():
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            lines = f.read().split("\n\n")[0].splitlines()
        info = {key.strip(): value for key, value in
                (line.split(":", 1) for line in lines if ":" in line)}
        flags = set(info.get("flags", "").split())
        wanted = [f for f in ("avx2", "avx512f", "avx512_bf16", "amx_bf16") if f in flags]
        return (f"{info['model name'].strip()}, cpu family {info['cpu family'].strip()}, "
                f"{' '.join(wanted)}")
    except (OSError, KeyError):
        return platform.processor() or "unknown CPU"


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ranks", default="1,2,4")
    parser.add_argument("--threads", type=int, default=os.cpu_count())
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--width", type=int, default=512)
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--ns-dtype", choices=sorted(NS_DTYPES), default="bfloat16",
                        help="muon_cpp's Newton–Schulz dtype (torch.optim.Muon's is bfloat16)")
    parser.add_argument("--sharding", default="ddp,fsdp2",
                        help="ddp: every rank the whole parameters; fsdp2: fully_shard's rows "
                             "(skipped where torch has no FSDP2)")
    parser.add_argument("--json")
    args = parser.parse_args()
    shapes = matrices(args.layers, args.width)
    numel = sum(r * c for r, c in shapes)
    print(f"python_ranks: torch {torch.__version__}, {cpu_name()}, {args.threads} threads; "
          f"{len(shapes)} matrices, {numel / 1e6:.2f}M parameters, {args.steps} steps; muon_cpp's "
          f"Newton–Schulz in {args.ns_dtype}")
    torch.set_num_threads(args.threads)
    rows = {}
    if hasattr(torch.optim, "Muon"):
        peer = torch.optim.Muon(make_params(shapes), **SETTINGS)
        rows["torch.optim.Muon, 1 process"] = statistics.median(step_times(peer, args.steps))
    alone_params = make_params(shapes)
    alone = muon_cpp.Muon(alone_params, **SETTINGS, ns_dtype=NS_DTYPES[args.ns_dtype])
    rows["muon_cpp.Muon, 1 process"] = statistics.median(step_times(alone, args.steps))
    out_dir = tempfile.mkdtemp()
    results = {"rows": rows, "ranks": {}}
    shardings = [s for s in args.sharding.split(",") if s != "fsdp2" or has_fsdp2()]
    for sharding, world in [(s, int(n)) for s in shardings for n in args.ranks.split(",")]:
        name = f"{sharding} {world}"
        init_file = os.path.join(out_dir, f"rendezvous_{sharding}_{world}")
        mp.start_processes(rank_main, args=(world, sharding, args, init_file, out_dir),
                           nprocs=world, start_method="spawn")
        reports = [json.load(open(os.path.join(out_dir, f"rank{r}_of_{world}.json"),
                                  encoding="utf-8")) for r in range(world)]
        final = torch.load(os.path.join(out_dir, f"params{world}.pt"))
        worst = max(((a - b.detach()).abs().max() / b.detach().abs().max()).item()
                    for a, b in zip(final, alone_params))
        rows[f"muon_cpp.Muon, {sharding.upper()}, {world} rank{'s' if world > 1 else ''} "
             f"({reports[0]['threads']} thread{'s' if reports[0]['threads'] > 1 else ''} each)"] \
            = reports[0]["median_ms"]
        results["ranks"][name] = {"median_ms": reports[0]["median_ms"],
                                  "owned_mb": [r["owned_bytes"] / 1e6 for r in reports],
                                  "max_relative_difference": worst}
    base = rows["muon_cpp.Muon, 1 process"]
    peer = rows.get("torch.optim.Muon, 1 process")
    print(f"{'configuration':56} {'ms/step':>8} {'vs muon_cpp 1 proc':>19} {'vs torch':>9}")
    for name, ms in rows.items():
        versus_peer = f"{peer / ms:9.2f}" if peer else f"{'n/a':>9}"
        print(f"{name:56} {ms:8.1f} {base / ms:19.2f} {versus_peer}")
    for name, r in results["ranks"].items():
        print(f"{name} rank(s): owned MB per rank {', '.join(f'{m:.1f}' for m in r['owned_mb'])}; "
              f"parameters vs one process: {r['max_relative_difference']:.1e} relative")
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump({"torch": torch.__version__, "cpu": cpu_name(), "threads": args.threads,
                       "ns_dtype": args.ns_dtype,
                       **results}, f, indent=1)


if __name__ == "__main__":
    sys.exit(main())
