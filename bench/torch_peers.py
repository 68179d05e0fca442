"""Optimizer steps on a GPT-shaped parameter set, muon_cpp beside PyTorch's own, in one run.

    python3 bench/torch_peers.py [--device cpu|cuda] [--threads N] [--layers 4] [--width 768]
                                 [--mlp swiglu|gelu] [--steps 10] [--json FILE]
                                 [--only muon|orthogonalize|adamw]

Muon on the hidden matrices (per layer q, k, v, o of width²; an MLP of hidden size 4·width:
gate, up and down with --mlp swiglu, up and down with gelu): torch.optim.Muon (PyTorch 2.9+,
bf16 Newton–Schulz) beside muon_cpp.Muon with bf16 and fp32 Newton–Schulz (on a GPU: its
default, bf16) and, where torch has no Muon, a plain bf16 ATen Muon written here. AdamW on every
tensor (embedding and norms too): torch.optim.AdamW(fused=True) (PyTorch 2.4+ on the CPU) and
(foreach=True) beside muon_cpp.AdamW, Adam and Lamb, with a copy of the same bytes as the
bandwidth they are bound by. Newton–Schulz alone: each distinct matrix shape (and 1024², 1024×4096)
orthogonalized by every Muon candidate's own chain, against torch.mm's fp32 and bf16 GEMM rates.

On the CPU every library runs on --threads threads: muon_cpp's products and kernels run on
PyTorch's intra-op threads, so torch.set_num_threads(N) sets both (docs/python.md §Threads).
Candidates are timed in rounds, one step each per round, and each figure is the median over the
rounds, so that all of them see the same phases of a noisy machine; ratios are taken within the
run. For muon_cpp's optimizers, the part of the step spent reading param_groups (for swapped
tensors and the settings' keys) before the engine runs. Accuracy: each candidate's Newton–Schulz result against the fp64 polar factor U·Vᵀ of the
same matrix, and each step's parameter change against torch's. Results also go to --json.
"""
import argparse
import json
import math
import os
import platform
import statistics
import subprocess
import sys
import time

import torch

import muon_cpp

QUINTIC = (3.4445, -4.7750, 2.0315)


def gpt_shapes(layers, width, vocab, mlp):
    hidden = 4 * width
    block = [(width, width)] * 4
    block += [(hidden, width)] * (2 if mlp == "swiglu" else 1) + [(width, hidden)]
    matrices = block * layers
    others = [(vocab, width), (width,)] + [(width,), (width,)] * layers
    return matrices, others


def make_params(shapes, device, seed):
    generator = torch.Generator(device="cpu").manual_seed(seed)
    params = []
    for shape in shapes:
        p = torch.nn.Parameter((torch.randn(shape, generator=generator) * 0.02).to(device))
        p.grad = (torch.randn(shape, generator=generator) * 1e-3).to(device)
        params.append(p)
    return params


def clone_params(params):
    out = []
    for p in params:
        q = torch.nn.Parameter(p.detach().clone())
        q.grad = p.grad.clone()
        out.append(q)
    return out


def timed(step, device):
    """Milliseconds one call of step() takes (CUDA events on a GPU)."""
    if device.type == "cuda":
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        step()
        end.record()
        torch.cuda.synchronize(device)
        return start.elapsed_time(end)
    begin = time.perf_counter()
    step()
    return (time.perf_counter() - begin) * 1e3


def median_times(steps_by_name, device, rounds, warmup):
    """Each round calls every step once; the median milliseconds of each over the rounds."""
    for _ in range(warmup):
        for step in steps_by_name.values():
            step()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    times = {name: [] for name in steps_by_name}
    for _ in range(rounds):
        for name, step in steps_by_name.items():
            times[name].append(timed(step, device))
    return {name: statistics.median(t) for name, t in times.items()}


def param_groups_reading(optimizer, repeats=2000):
    """The Python work muon_cpp's step() does before its engine runs, in microseconds per step:
    param_groups read for changed tensors (one identity check each) and every group's settings
    for torch's names and other algorithms' keys. None for torch's own optimizers."""
    if not hasattr(optimizer, "_sync_params"):
        return None
    begin = time.perf_counter()
    for _ in range(repeats):
        optimizer._sync_params("step()")
        for group in optimizer.param_groups:
            optimizer._from_torch_names(group)
    return (time.perf_counter() - begin) / repeats * 1e6


def print_reading(optimizer, step_ms, row):
    reading = param_groups_reading(optimizer)
    if reading is not None:
        row["param_groups_reading_us"] = reading
        print(f"  {'':24s} of which reading param_groups: {reading:.1f} µs "
              f"({reading / (step_ms * 1e3) * 100:.3f}% of the step)")


def first_step_change(make_optimizer, params):
    """The parameter change of one step of a fresh optimizer over copies of `params`."""
    copies = clone_params(params)
    before = [p.detach().clone() for p in copies]
    make_optimizer(copies).step()
    return [p.detach() - b for p, b in zip(copies, before)]


def largest_difference(ours, theirs):
    worst = 0.0
    for a, b in zip(ours, theirs):
        scale = b.abs().max().item()
        worst = max(worst, (a - b).abs().max().item() / max(scale, 1e-30))
    return worst


def plain_bf16_newton_schulz(g, steps=5):
    """Keller Jordan's quintic in bf16 ATen operations, on the smaller side."""
    X = g.bfloat16()
    tall = X.size(-2) > X.size(-1)
    if tall:
        X = X.mT
    X = X / (X.norm() + 1e-7)
    a, b, c = QUINTIC
    for _ in range(steps):
        A = X @ X.mT
        X = a * X + (b * A + c * A @ A) @ X
    return X.mT if tall else X


class PlainBf16Muon:
    """Muon as a loop of ATen operations in bf16: EMA momentum with Nesterov, the quintic
    Newton–Schulz on the smaller side, decoupled decay, lr·√max(1, rows/cols)."""

    def __init__(self, params, lr, momentum, weight_decay):
        self.params, self.lr, self.momentum = params, lr, momentum
        self.weight_decay = weight_decay
        self.buffers = [torch.zeros_like(p) for p in params]

    @torch.no_grad()
    def step(self):
        for p, buf in zip(self.params, self.buffers):
            buf.lerp_(p.grad, 1 - self.momentum)
            update = plain_bf16_newton_schulz(p.grad.lerp(buf, self.momentum))
            p.mul_(1 - self.lr * self.weight_decay)
            p.add_(update.to(p.dtype), alpha=-self.lr * math.sqrt(max(1.0, p.size(0) / p.size(1))))


def muon_candidates(device):
    settings = dict(lr=0.02, momentum=0.95, weight_decay=0.1)
    candidates, newton_schulz = {}, {}
    if hasattr(torch.optim, "Muon"):
        candidates["torch.optim.Muon"] = lambda ps: torch.optim.Muon(
            ps, nesterov=True, ns_coefficients=QUINTIC, eps=1e-7, ns_steps=5, **settings)
        from torch.optim._muon import _zeropower_via_newtonschulz
        newton_schulz["torch.optim.Muon"] = lambda g: _zeropower_via_newtonschulz(
            g, QUINTIC, 5, 1e-7)
    else:
        print(f"torch.optim.Muon: not in torch {torch.__version__} (2.9+); "
              "a plain bf16 ATen Muon stands in")
        candidates["plain bf16 ATen Muon"] = lambda ps: PlainBf16Muon(ps, **settings)
        newton_schulz["plain bf16 ATen Muon"] = plain_bf16_newton_schulz
    dtypes = [torch.bfloat16, torch.float32] if device.type == "cpu" else [None]
    for dtype in dtypes:
        name = "muon_cpp.Muon" + ("" if dtype is None else f" {str(dtype)[6:]}")
        try:
            muon_cpp.orthogonalize(torch.ones(2, 2, device=device), dtype=dtype)
        except ValueError as e:
            print(f"{name}: not run: {e}")
            continue
        candidates[name] = lambda ps, dtype=dtype: muon_cpp.Muon(ps, nesterov=True,
                                                                  ns_dtype=dtype, **settings)
        newton_schulz[name] = lambda g, dtype=dtype: muon_cpp.orthogonalize(g, dtype=dtype)
    return candidates, newton_schulz


def polar_error(newton_schulz, g):
    """‖NS(g) − U·Vᵀ‖_F / ‖U·Vᵀ‖_F, U·Vᵀ the fp64 polar factor of g."""
    U, _, Vh = torch.linalg.svd(g.double(), full_matrices=False)
    polar = U @ Vh
    return ((newton_schulz(g).double() - polar).norm() / polar.norm()).item()


def bench_muon(args, device, results):
    shapes, _ = gpt_shapes(args.layers, args.width, args.vocab, args.mlp)
    params = make_params(shapes, device, 0)
    candidates, newton_schulz = muon_candidates(device)
    reference = next(iter(candidates))
    changes = {name: first_step_change(make, params) for name, make in candidates.items()}
    distinct = {}
    for p in params:
        distinct.setdefault(tuple(p.shape), p.grad / p.grad.norm())
    print(f"\nMuon, {len(shapes)} matrices ({args.layers} layers × width {args.width}, "
          f"{args.mlp} MLP), {sum(math.prod(s) for s in shapes) / 1e6:.1f}M parameters, {device}")
    optimizers = {name: make(clone_params(params)) for name, make in candidates.items()}
    times = median_times({n: o.step for n, o in optimizers.items()}, device, args.steps,
                         args.warmup)
    for name in candidates:
        row = {"step_ms": times[name], "speed_vs_" + reference: times[reference] / times[name],
               "largest_step_difference_vs_" + reference: largest_difference(changes[name],
                                                                             changes[reference]),
               "polar_error": {"x".join(map(str, s)): polar_error(newton_schulz[name], g)
                               for s, g in distinct.items()}}
        results["muon"][name] = row
        errors = ", ".join(f"{s} {e:.3f}" for s, e in row["polar_error"].items())
        print(f"  {name:24s} {times[name]:9.1f} ms/step  {row['speed_vs_' + reference]:5.2f}× "
              f"{reference}'s speed   step vs it {row['largest_step_difference_vs_' + reference]:.1e}"
              f"   ‖NS − polar‖/‖polar‖: {errors}")
        print_reading(optimizers[name], times[name], row)


def bench_orthogonalize(args, device, results):
    """Each distinct matrix shape of the run (and the 1024² and 1024×4096 of `muon bench`)
    orthogonalized alone, in the same rounds as a 2048³ GEMM per dtype; GFLOP/s count the plain
    chain's 5·(4k²m + 2k³) FLOPs, whatever each method does."""
    matrices, _ = gpt_shapes(args.layers, args.width, args.vocab, args.mlp)
    shapes = list(dict.fromkeys([tuple(s) for s in matrices] + [(1024, 1024), (1024, 4096)]))
    _, newton_schulz = muon_candidates(device)
    generator = torch.Generator(device="cpu").manual_seed(2)
    steps, flops = {}, {}
    for dtype in (torch.float32, torch.bfloat16):
        a = torch.randn(2048, 2048, generator=generator).to(device, dtype)
        steps[f"GEMM 2048³ {str(dtype)[6:]}"] = lambda a=a: torch.mm(a, a)
    for shape in shapes:
        g = torch.randn(shape, generator=generator).to(device)
        k, m = min(shape), max(shape)
        for name, ns in newton_schulz.items():
            steps[(shape, name)] = lambda ns=ns, g=g: ns(g)
            flops[(shape, name)] = 5 * (4 * k * k * m + 2 * k ** 3)
    times = median_times(steps, device, args.steps, args.warmup)
    gemm = {dtype: 2 * 2048 ** 3 / times[f"GEMM 2048³ {dtype}"] / 1e6
            for dtype in ("float32", "bfloat16")}
    reference = next(iter(newton_schulz))
    print(f"\northogonalize, each matrix alone, {device}: GEMM 2048³ "
          f"fp32 {gemm['float32']:.0f} GFLOP/s, bf16 {gemm['bfloat16']:.0f} GFLOP/s (torch.mm)")
    results["orthogonalize"] = {"gemm_gflops": gemm, "shapes": {}}
    for shape in shapes:
        label = "x".join(map(str, shape))
        row = results["orthogonalize"]["shapes"].setdefault(label, {})
        for name in newton_schulz:
            ms = times[(shape, name)]
            rate = flops[(shape, name)] / ms / 1e6
            row[name] = {"ms": ms, "of_fp32_gemm": rate / gemm["float32"],
                         "of_bf16_gemm": rate / gemm["bfloat16"],
                         "speed_vs_" + reference: times[(shape, reference)] / ms}
            print(f"  {label:10s} {name:24s} {ms:8.1f} ms  {rate:6.0f} GFLOP/s = "
                  f"{row[name]['of_fp32_gemm']:4.2f}× fp32 GEMM, {row[name]['of_bf16_gemm']:4.2f}× "
                  f"bf16 GEMM   {row[name]['speed_vs_' + reference]:5.2f}× {reference}'s speed")


def bench_adamw(args, device, results):
    matrices, others = gpt_shapes(args.layers, args.width, args.vocab, args.mlp)
    shapes = matrices + others
    params = make_params(shapes, device, 1)
    settings = dict(lr=3e-4, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1)
    candidates = {}
    try:
        torch.optim.AdamW(clone_params(params[:1]), fused=True, **settings).step()
        candidates["torch.optim.AdamW(fused=True)"] = lambda ps: torch.optim.AdamW(
            ps, fused=True, **settings)
    except (RuntimeError, TypeError) as e:
        print(f"torch.optim.AdamW(fused=True): not run here ({str(e).splitlines()[0]})")
    candidates["torch.optim.AdamW(foreach=True)"] = lambda ps: torch.optim.AdamW(
        ps, foreach=True, **settings)
    candidates["muon_cpp.AdamW"] = lambda ps: muon_cpp.AdamW(ps, **settings)
    candidates["muon_cpp.Adam"] = lambda ps: muon_cpp.Adam(ps, **settings)
    candidates["muon_cpp.Lamb"] = lambda ps: muon_cpp.Lamb(ps, **settings)
    reference = next(iter(candidates))
    changes = {name: first_step_change(make, params)
               for name, make in candidates.items() if "AdamW" in name}
    count = sum(math.prod(s) for s in shapes)
    # What bounds these steps is memory traffic: p, g, m, v read and p, m, v written (fp32), 7
    # tensors' bytes; a copy of 3.5 tensors' worth moves as many (read once, written once).
    source = torch.empty(count * 7 // 2, device=device)
    target = torch.empty_like(source)
    optimizers = {name: make(clone_params(params)) for name, make in candidates.items()}
    steps = {name: optimizer.step for name, optimizer in optimizers.items()}
    steps["copy of the same bytes"] = lambda: target.copy_(source)
    times = median_times(steps, device, args.steps, args.warmup)
    print(f"\nAdamW, {len(shapes)} tensors, {count / 1e6:.1f}M parameters, {device}")
    for name, ms in times.items():
        bandwidth = 7 * 4 * count / (ms * 1e-3) / 1e9
        row = {"step_ms": ms, "GB_per_s": bandwidth,
               "speed_vs_" + reference: times[reference] / ms}
        line = (f"  {name:32s} {ms:9.2f} ms/step  {bandwidth:6.1f} GB/s  "
                f"{row['speed_vs_' + reference]:5.2f}× {reference}'s speed")
        if name in changes:
            row["largest_step_difference_vs_" + reference] = largest_difference(
                changes[name], changes[reference])
            line += f"   step vs it {row['largest_step_difference_vs_' + reference]:.1e}"
        results["adamw"][name] = row
        print(line)
        if name in optimizers:
            print_reading(optimizers[name], ms, row)


def cpuinfo():
    """The first CPU's /proc/cpuinfo fields, and its feature flags as a set."""
    with open("/proc/cpuinfo") as f:
        first = f.read().split("\n\n")[0].splitlines()
    info = {key.strip(): value.strip() for key, value in
            (line.split(":", 1) for line in first if ":" in line)}
    return info, set(info.get("flags", "").split())


def cpu_name():
    try:
        info, flags = cpuinfo()
        wanted = [f for f in ("avx2", "avx512f", "avx512_bf16", "amx_bf16") if f in flags]
        return f"{info['model name']}, cpu family {info['cpu family']}, {' '.join(wanted)}"
    except (OSError, KeyError, ValueError):
        return platform.processor() or "CPU"


def run_metadata():
    """What a reader of the JSON needs to place its figures: the CPU's identity and features,
    muon_cpp's build, the date, OpenBLAS's overrides and the load when the run began."""
    meta = {"date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "command": " ".join(sys.argv),
            "muon_cpp": getattr(muon_cpp, "__version__", None),
            "muon_cpp_products": {"fp32": muon_cpp._core.blas_backend(),
                                  "bf16": muon_cpp._core.bf16_products()},
            "openblas_env": {k: os.environ.get(k) for k in
                             ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE", "OPENBLAS_NUM_THREADS")},
            "load_average_at_start": list(os.getloadavg())}
    try:
        meta["commit"] = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, timeout=10,
            cwd=os.path.dirname(os.path.abspath(__file__))).stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        meta["commit"] = None
    try:
        info, flags = cpuinfo()
        meta["cpu"] = {"model_name": info.get("model name"), "cpu_family": info.get("cpu family"),
                       "model": info.get("model"),
                       "flags": [f for f in ("avx2", "fma", "avx512f", "avx512_bf16", "amx_bf16",
                                             "amx_tile") if f in flags]}
    except OSError:
        meta["cpu"] = {"model_name": platform.processor() or None}
    return meta


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--threads", type=int, default=os.cpu_count(),
                        help="PyTorch's intra-op threads, which muon_cpp uses too (CPU)")
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--width", type=int, default=768)
    parser.add_argument("--mlp", choices=["swiglu", "gelu"], default="swiglu")
    parser.add_argument("--vocab", type=int, default=50304)
    parser.add_argument("--steps", type=int, default=10, help="timed rounds")
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--only", choices=["muon", "orthogonalize", "adamw"])
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        sys.exit("torch_peers: CUDA is not available to this PyTorch")
    if device.type == "cpu":
        torch.set_num_threads(args.threads)
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else cpu_name()
    print(f"torch_peers: torch {torch.__version__}, {name}, "
          f"{torch.get_num_threads()} intra-op threads")
    if device.type == "cpu":
        print(f"muon_cpp's fp32 products: {muon_cpp._core.blas_backend()}\n"
              f"muon_cpp's bf16 products: {muon_cpp._core.bf16_products()}")
    results = {"torch": torch.__version__, "device": name, "threads": torch.get_num_threads(),
               "layers": args.layers, "width": args.width, "mlp": args.mlp, "vocab": args.vocab,
               "run": run_metadata(), "muon": {}, "orthogonalize": {}, "adamw": {}}
    sections = {"muon": bench_muon, "orthogonalize": bench_orthogonalize, "adamw": bench_adamw}
    for name, bench in sections.items():
        if args.only in (None, name):
            bench(args, device, results)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=2)
        print(f"\nwrote {args.json}")


if __name__ == "__main__":
    main()
