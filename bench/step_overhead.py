"""What a step costs beyond its arithmetic: AdamW over many small tensors, where the per-tensor
work (dispatch, checks, settings) is all there is, beside torch's fused and foreach AdamW.

    python3 bench/step_overhead.py [--threads N] [--tensors 2000] [--elements 256] [--groups 1]
                                   [--steps 30] [--budget 30] [--json FILE]

--tensors tensors of --elements float32 elements each, spread over --groups param groups, all
with gradients; every candidate steps the same tensors' copies in alternating rounds
(bench/peer_timing.py) and each figure is the median step over the rounds, divided by the tensor
count: microseconds per tensor. For muon_cpp, also the Python work of its step around the engine
(param_groups read for swapped tensors and changed settings, which cross into the engine only
when they change) per step.
"""
import argparse
import os

import torch

import muon_cpp
from peer_machine import cpu_name, run_metadata, write_json
from peer_timing import attempt, median_times, mm_rates, param_groups_reading, record


def param_groups(args, seed=0):
    generator = torch.Generator().manual_seed(seed)
    tensors = []
    for _ in range(args.tensors):
        p = torch.nn.Parameter(torch.randn(args.elements, generator=generator))
        p.grad = torch.randn(args.elements, generator=generator)
        tensors.append(p)
    return [{"params": tensors[g::args.groups]} for g in range(args.groups)]


def candidates():
    settings = {"lr": 1e-3, "weight_decay": 0.01}
    return {
        "torch.optim.AdamW(fused=True)":
            lambda groups: torch.optim.AdamW(groups, fused=True, **settings),
        "torch.optim.AdamW(foreach=True)":
            lambda groups: torch.optim.AdamW(groups, foreach=True, **settings),
        "muon_cpp.AdamW": lambda groups: muon_cpp.AdamW(groups, **settings),
    }


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--threads", type=int, default=os.cpu_count())
    parser.add_argument("--tensors", type=int, default=2000)
    parser.add_argument("--elements", type=int, default=256)
    parser.add_argument("--groups", type=int, default=1)
    parser.add_argument("--steps", type=int, default=30, help="timed rounds")
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--budget", type=float, default=30)
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    meta = run_metadata()
    torch.set_num_threads(args.threads)
    args.mm_rates = mm_rates(torch.device("cpu"))
    print(f"step_overhead: torch {torch.__version__}, {cpu_name()}, {args.threads} threads; "
          f"{args.tensors} tensors of {args.elements} elements in {args.groups} param group(s)")
    failed = {}
    optimizers = {name: attempt(name, lambda make=make: make(param_groups(args)), failed)
                  for name, make in candidates().items()}
    runs = median_times({name: o.step for name, o in optimizers.items() if o is not None},
                        torch.device("cpu"), args)
    fused = getattr(runs.get("torch.optim.AdamW(fused=True)"), "ms", None)
    rows = {name: {"error": error} for name, error in failed.items()}
    for name, run in runs.items():
        row = rows[name] = {"step_ms": run.ms}
        record(name, run, row)
        if run.ms is None:
            continue
        row["us_per_tensor"] = run.ms * 1e3 / args.tensors
        line = f"  {name:34s} {run.ms:8.3f} ms/step  {row['us_per_tensor']:6.2f} µs/tensor"
        if fused:
            row["speed_vs_fused_adamw"] = fused / run.ms
            line += f"  {row['speed_vs_fused_adamw']:5.2f}x fused AdamW"
        reading = param_groups_reading(optimizers[name])
        if reading is not None:
            row["param_groups_reading_us"] = reading
            line += f"  (reading param_groups {reading:.1f} µs/step)"
        print(line)
    write_json(args.json, dict(torch=torch.__version__, device=cpu_name(), threads=args.threads,
                               tensors=args.tensors, elements=args.elements, groups=args.groups,
                               run=meta, candidates=rows))


if __name__ == "__main__":
    main()
