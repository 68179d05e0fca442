"""Optimizer state in float32, bfloat16 and int8: bytes per parameter, a step's peak memory and
its time, muon_cpp beside PyTorch's optimizers and the 8-bit AdamWs of torchao and bitsandbytes,
in one run.

    python3 bench/state_memory.py [--threads N] [--layers 4] [--width 768] [--vocab 50304]
                                  [--steps 10] [--budget 60] [--only adamw|muon] [--json FILE]

Two parameter sets of the GPT shapes bench/torch_peers.py uses (4 layers of width 768 by
default): AdamW on every tensor (the embedding and norms too: 76.4M parameters) and Muon on the
hidden matrices. Candidates: torch.optim.AdamW(fused=True) and muon_cpp.AdamW with float32,
bfloat16 and int8 state, torchao's and bitsandbytes' AdamW8bit where they import and run on this
device (else their error goes to the JSON); torch.optim.Muon and muon_cpp.Muon with float32,
bfloat16 and int8 momentum (bf16 Newton–Schulz in both).

Memory is measured in a fresh process per candidate (this script with --child): the resident
set after the parameters and gradients exist (VmRSS), then its peak (VmHWM) over a warm-up step
(which makes the state) and three more: state bytes per parameter (every state tensor, the parts of a quantized
tensor subclass counted, step counters not), and the peak's growth over the parameters and
gradients per parameter. Step times come from one process, in alternating rounds
(bench/peer_timing.py), against torch.optim.AdamW(fused=True) and torch.optim.Muon.
"""
import argparse
import json
import math
import os
import subprocess
import sys

import torch

import muon_cpp
from peer_machine import cpu_name, run_metadata, write_json
from peer_timing import gflops, median_times, mm_rates, record, PROBE_SIZE
from torch_peers import gpt_shapes


def adamw_candidates():
    settings = dict(lr=3e-4, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1)

    def torchao(ps):
        from torchao.optim import AdamW8bit
        return AdamW8bit(ps, **settings)

    def bitsandbytes(ps):
        import bitsandbytes
        return bitsandbytes.optim.AdamW8bit(ps, **settings)

    return {
        "torch.optim.AdamW(fused=True)": lambda ps: torch.optim.AdamW(ps, fused=True, **settings),
        "muon_cpp.AdamW float32 state": lambda ps: muon_cpp.AdamW(ps, **settings),
        "muon_cpp.AdamW bfloat16 state": lambda ps: muon_cpp.AdamW(
            ps, state_dtype=torch.bfloat16, **settings),
        "muon_cpp.AdamW int8 state": lambda ps: muon_cpp.AdamW(ps, state_dtype="int8", **settings),
        "torchao.optim.AdamW8bit": torchao,
        "bitsandbytes.optim.AdamW8bit": bitsandbytes,
    }


def muon_candidates():
    settings = dict(lr=0.02, momentum=0.95, weight_decay=0.01)
    ours = dict(settings, ns_dtype=torch.bfloat16)  # bf16 Newton–Schulz, as torch.optim.Muon
    return {
        "torch.optim.Muon": lambda ps: torch.optim.Muon(ps, **settings),
        "muon_cpp.Muon float32 momentum": lambda ps: muon_cpp.Muon(ps, **ours),
        "muon_cpp.Muon bfloat16 momentum": lambda ps: muon_cpp.Muon(
            ps, state_dtype=torch.bfloat16, **ours),
        "muon_cpp.Muon int8 momentum": lambda ps: muon_cpp.Muon(ps, state_dtype="int8", **ours),
    }


SETS = {"adamw": adamw_candidates, "muon": muon_candidates}


def shapes_of(args, which):
    matrices, others = gpt_shapes(args.layers, args.width, args.vocab, "swiglu")
    return matrices + others if which == "adamw" else matrices


def make_params(shapes, seed):
    """Parameters and gradients drawn in place: no temporaries to raise the memory peak."""
    generator = torch.Generator().manual_seed(seed)
    params = []
    for shape in shapes:
        p = torch.nn.Parameter(torch.empty(shape).normal_(0, 0.02, generator=generator))
        p.grad = torch.empty(shape).normal_(0, 1e-3, generator=generator)
        params.append(p)
    return params


def tensor_bytes(t, seen):
    """Bytes of t's storage (once per storage), or of its parts for a tensor subclass that
    holds others (torchao's OptimState8bit: codes, scale, qmap)."""
    if hasattr(type(t), "__tensor_flatten__"):
        names, _ = t.__tensor_flatten__()
        return sum(tensor_bytes(getattr(t, n), seen) for n in names)
    key = t.data_ptr()
    if key in seen:
        return 0
    seen.add(key)
    return t.numel() * t.element_size()


def state_bytes(optimizer):
    seen, total = set(), 0
    for state in optimizer.state.values():
        for key, value in state.items():
            if key != "step" and torch.is_tensor(value):
                total += tensor_bytes(value, seen)
    return total


def status_bytes(field):
    """A field of /proc/self/status in bytes: VmRSS (resident now) or VmHWM (its peak). Not
    getrusage's ru_maxrss, which Linux carries over from the parent through fork and exec."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    raise RuntimeError(f"/proc/self/status has no {field}")


def child(args):
    """One candidate's memory, printed as JSON."""
    torch.set_num_threads(args.threads)
    params = make_params(shapes_of(args, args.set), 1)
    count = sum(p.numel() for p in params)
    before = status_bytes("VmRSS")
    optimizer = SETS[args.set]()[args.child](params)
    for _ in range(4):
        optimizer.step()
    peak = status_bytes("VmHWM")
    print(json.dumps({"state_bytes_per_param": state_bytes(optimizer) / count,
                      "peak_MB": peak / 2 ** 20,
                      "params_and_grads_MB": before / 2 ** 20,
                      "peak_growth_bytes_per_param": (peak - before) / count}))


def measure_memory(args, which, name):
    command = [sys.executable, os.path.abspath(__file__), "--child", name, "--set", which,
               "--threads", str(args.threads), "--layers", str(args.layers),
               "--width", str(args.width), "--vocab", str(args.vocab)]
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode != 0:
        lines = [l for l in done.stderr.strip().splitlines() if l.strip()]
        return {"error": lines[-1] if lines else f"exit status {done.returncode}"}
    return json.loads(done.stdout.strip().splitlines()[-1])


def bench_set(args, which, results):
    shapes = shapes_of(args, which)
    count = sum(math.prod(s) for s in shapes)
    print(f"\n{which}: {len(shapes)} tensors, {count / 1e6:.1f}M parameters, "
          f"{args.threads} threads")
    rows = results[which] = {}
    params = make_params(shapes, 1)
    optimizers = {}
    for name, make in SETS[which]().items():
        rows[name] = measure_memory(args, which, name)
        if "error" in rows[name]:
            print(f"  {name}: not run: {rows[name]['error']}")
            continue
        copies = [torch.nn.Parameter(p.detach().clone()) for p in params]
        for c, p in zip(copies, params):
            c.grad = p.grad.clone()
        optimizers[name] = make(copies)
    reference = next(iter(optimizers))
    runs = median_times({n: o.step for n, o in optimizers.items()}, torch.device("cpu"), args)
    for name, run in runs.items():
        row = rows[name]
        row["step_ms"] = run.ms
        record(name, run, row)
        speed = ""
        if run.ms is not None and runs[reference].ms is not None:
            row["speed_vs_" + reference] = runs[reference].ms / run.ms
            speed = f"{row['speed_vs_' + reference]:5.2f}× {reference}'s speed"
        print(f"  {name:32s} state {row['state_bytes_per_param']:5.2f} B/param   peak "
              f"{row['peak_MB']:7.0f} MB (+{row['peak_growth_bytes_per_param']:5.2f} B/param "
              f"over {row['params_and_grads_MB']:.0f} MB)   "
              + (f"{run.ms:8.1f} ms/step  {speed}" if run.ms is not None else run.note or ""))


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--threads", type=int, default=os.cpu_count())
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--width", type=int, default=768)
    parser.add_argument("--vocab", type=int, default=50304)
    parser.add_argument("--steps", type=int, default=10, help="timed rounds")
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--budget", type=float, default=60)
    parser.add_argument("--only", choices=list(SETS))
    parser.add_argument("--json", default=None)
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--set", choices=list(SETS), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args)
        return
    torch.set_num_threads(args.threads)
    args.mm_rates = mm_rates(torch.device("cpu"))
    print(f"state_memory: torch {torch.__version__}, {cpu_name()}, {args.threads} threads; "
          f"torch.mm {PROBE_SIZE}² fp32 {gflops(args.mm_rates['float32'])}, "
          f"bf16 {gflops(args.mm_rates['bfloat16'])}")
    results = {"torch": torch.__version__, "device": cpu_name(), "threads": args.threads,
               "layers": args.layers, "width": args.width, "vocab": args.vocab,
               "run": dict(run_metadata(), budget_s=args.budget)}
    for which in SETS:
        if args.only in (None, which):
            bench_set(args, which, results)
    write_json(args.json, results)


if __name__ == "__main__":
    main()
