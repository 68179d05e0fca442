"""Optimizer steps on a GPT-shaped parameter set, muon_cpp beside PyTorch's own, in one run.

    python3 bench/torch_peers.py [--device cpu|cuda] [--threads N] [--layers 4] [--width 768]
                                 [--mlp swiglu|gelu] [--steps 10] [--budget 60] [--json FILE]
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
run. Each candidate has --budget seconds for its timed calls (bench/peer_timing.py): one past it
takes no more rounds, with a line that says so (and names torch's bf16 GEMM rate, measured first,
where a bf16 candidate was that slow), so the run ends on a CPU whose bf16 products crawl. A
candidate that raises is reported and the others go on. For muon_cpp's optimizers, the part of
the step spent reading param_groups (for swapped tensors and the settings' keys) before the
engine runs. Accuracy: each candidate's Newton–Schulz result against the fp64 polar factor U·Vᵀ
of the same matrix, and each step's parameter change against torch's. Results also go to --json.
"""
import argparse
import math
import os
import sys

import torch

import muon_cpp
from peer_machine import cpu_name, run_metadata, write_json
from peer_timing import (attempt, gflops, median_times, mm_rates, print_reading, record,
                         PROBE_SIZE)

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


class FirstChange:
    """A fresh optimizer over copies of `params`, whose step() keeps the parameter change of its
    first call: that call, a warm-up one where the budget leaves room, is also the accuracy check,
    so that a candidate whose step takes minutes makes no extra step for it."""

    def __init__(self, make_optimizer, params, keep=True):
        self.params = clone_params(params)
        self.optimizer = make_optimizer(self.params)
        self.before = [p.detach().clone() for p in self.params] if keep else None
        self.change = None

    def step(self):
        self.optimizer.step()
        if self.before is not None:
            self.change = [p.detach() - b for p, b in zip(self.params, self.before)]
            self.before = None


def largest_difference(ours, theirs):
    """None where either step's change was not kept (not compared, or its first call raised)."""
    if ours is None or theirs is None:
        return None
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


# The candidates whose products are torch's bf16 torch.mm.
TORCH_BF16 = ("torch.optim.Muon", "plain bf16 ATen Muon")


def muon_candidates(device, failed):
    """The Muon candidates' constructors and Newton–Schulz functions; one that fails a first
    product lands in `failed` with its error line instead."""
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
        if attempt(name, lambda: muon_cpp.orthogonalize(torch.ones(2, 2, device=device),
                                                        dtype=dtype), failed) is None:
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
    print(f"\nMuon, {len(shapes)} matrices ({args.layers} layers × width {args.width}, "
          f"{args.mlp} MLP), {sum(math.prod(s) for s in shapes) / 1e6:.1f}M parameters, {device}")
    failed = {}
    candidates, newton_schulz = muon_candidates(device, failed)
    optimizers = made(candidates, params, failed)
    distinct = {}
    for p in params:
        distinct.setdefault(tuple(p.shape), p.grad / p.grad.norm())
    runs = median_times({n: o.step for n, o in optimizers.items()}, device, args, TORCH_BF16)
    results["muon"].update({name: {"error": line} for name, line in failed.items()})
    reference = next(iter(optimizers))
    for name, run in runs.items():
        row = results["muon"][name] = {"step_ms": run.ms}
        if run.ms is not None:
            print_muon_row(name, run.ms, runs[reference].ms, reference,
                           largest_difference(optimizers[name].change,
                                              optimizers[reference].change),
                           {"x".join(map(str, s)): polar_error(newton_schulz[name], g)
                            for s, g in distinct.items()}, row)
        record(name, run, row)
        if run.ms is not None:
            print_reading(optimizers[name].optimizer, run.ms, row)


def made(candidates, params, failed, compared=lambda name: True):
    """Each candidate's FirstChange over copies of `params` (keeping the change for the names
    `compared` accepts); one whose constructor raises lands in `failed` instead."""
    optimizers = {name: attempt(name, lambda make=make, name=name: FirstChange(
        make, params, compared(name)), failed) for name, make in candidates.items()}
    return {name: o for name, o in optimizers.items() if o is not None}


def print_muon_row(name, ms, reference_ms, reference, difference, polar, row):
    """One Muon candidate's line: its step, its speed against the reference's, how far its step
    and its Newton–Schulz result are from the reference's step and the polar factor."""
    if reference_ms is not None:
        row["speed_vs_" + reference] = reference_ms / ms
    row["largest_step_difference_vs_" + reference] = difference
    row["polar_error"] = polar
    speed = f"{reference_ms / ms:5.2f}×" if reference_ms is not None else "    —"
    step = f"{difference:.1e}" if difference is not None else "—"
    errors = ", ".join(f"{s} {e:.3f}" for s, e in polar.items())
    print(f"  {name:24s} {ms:9.1f} ms/step  {speed} {reference}'s speed   step vs it "
          f"{step}   ‖NS − polar‖/‖polar‖: {errors}")


def bench_orthogonalize(args, device, results):
    """Each distinct matrix shape of the run (and the 1024² and 1024×4096 of `muon bench`)
    orthogonalized alone, in the same rounds as a 2048³ GEMM per dtype; GFLOP/s count the plain
    chain's 5·(4k²m + 2k³) FLOPs, whatever each method does."""
    matrices, _ = gpt_shapes(args.layers, args.width, args.vocab, args.mlp)
    shapes = list(dict.fromkeys([tuple(s) for s in matrices] + [(1024, 1024), (1024, 4096)]))
    print(f"\northogonalize, each matrix alone, {device}")
    _, newton_schulz = muon_candidates(device, {})
    generator = torch.Generator(device="cpu").manual_seed(2)
    steps, flops = {}, {}
    for dtype in ("float32", "bfloat16"):
        a = torch.randn(2048, 2048, generator=generator).to(device, getattr(torch, dtype))
        steps[dtype] = lambda a=a: torch.mm(a, a)
    for shape in shapes:
        g = torch.randn(shape, generator=generator).to(device)
        k, m = min(shape), max(shape)
        for name, ns in newton_schulz.items():
            steps[(shape, name)] = lambda ns=ns, g=g: ns(g)
            flops[(shape, name)] = 5 * (4 * k * k * m + 2 * k ** 3)
    bf16 = {"bfloat16"} | {(s, n) for s in shapes for n in newton_schulz if n in TORCH_BF16}
    runs = median_times(steps, device, args, bf16)
    gemm = {dtype: 2 * 2048 ** 3 / runs[dtype].ms / 1e6 for dtype in ("float32", "bfloat16")}
    print(f"  GEMM 2048³ (torch.mm): fp32 {gflops(gemm['float32'])}, "
          f"bf16 {gflops(gemm['bfloat16'])}")
    results["orthogonalize"] = {"gemm_gflops": gemm, "gemm": {d: {} for d in gemm}, "shapes": {}}
    for dtype, row in results["orthogonalize"]["gemm"].items():
        record(f"GEMM 2048³ {dtype}", runs[dtype], row)
    reference = next(iter(newton_schulz))
    for shape in shapes:
        label = "x".join(map(str, shape))
        row = results["orthogonalize"]["shapes"].setdefault(label, {})
        for name in newton_schulz:
            row[name] = orthogonalize_row(label, name, runs[(shape, name)], flops[(shape, name)],
                                          gemm, runs[(shape, reference)].ms, reference)


def orthogonalize_row(label, name, run, flops, gemm, reference_ms, reference):
    """One Newton–Schulz candidate on one shape, printed: its rate against the GEMMs' and its speed
    against the reference's."""
    row = {"ms": run.ms}
    if run.ms is not None:
        rate = flops / run.ms / 1e6
        row.update(of_fp32_gemm=rate / gemm["float32"], of_bf16_gemm=rate / gemm["bfloat16"])
        speed = "    —"
        if reference_ms is not None:
            row["speed_vs_" + reference] = reference_ms / run.ms
            speed = f"{reference_ms / run.ms:5.2f}×"
        print(f"  {label:10s} {name:24s} {run.ms:8.1f} ms  {rate:6.0f} GFLOP/s = "
              f"{row['of_fp32_gemm']:4.2f}× fp32 GEMM, {row['of_bf16_gemm']:4.2f}× bf16 GEMM   "
              f"{speed} {reference}'s speed")
    record(f"{label} {name}", run, row)
    return row


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
    failed = {}
    optimizers = made(candidates, params, failed, compared=lambda name: "AdamW" in name)
    results["adamw"].update({name: {"error": line} for name, line in failed.items()})
    reference = next(iter(optimizers))
    count = sum(math.prod(s) for s in shapes)
    # What bounds these steps is memory traffic: p, g, m, v read and p, m, v written (fp32), 7
    # tensors' bytes; a copy of 3.5 tensors' worth moves as many (read once, written once).
    source = torch.empty(count * 7 // 2, device=device)
    target = torch.empty_like(source)
    steps = {name: optimizer.step for name, optimizer in optimizers.items()}
    steps["copy of the same bytes"] = lambda: target.copy_(source)
    runs = median_times(steps, device, args)
    print(f"\nAdamW, {len(shapes)} tensors, {count / 1e6:.1f}M parameters, {device}")
    for name, run in runs.items():
        row = results["adamw"][name] = {"step_ms": run.ms}
        if run.ms is not None:
            change = optimizers[name].change if name in optimizers else None
            print_adamw_row(name, run.ms, runs[reference].ms, reference, count,
                            largest_difference(change, optimizers[reference].change), row)
        record(name, run, row)
        if name in optimizers and run.ms is not None:
            print_reading(optimizers[name].optimizer, run.ms, row)


def print_adamw_row(name, ms, reference_ms, reference, count, difference, row):
    """One AdamW candidate's line: its step, the bandwidth it moves, its speed against the
    reference's and, for the AdamWs, how far its step is from the reference's."""
    row["GB_per_s"] = 7 * 4 * count / (ms * 1e-3) / 1e9
    line = f"  {name:32s} {ms:9.2f} ms/step  {row['GB_per_s']:6.1f} GB/s  "
    if reference_ms is not None:
        row["speed_vs_" + reference] = reference_ms / ms
        line += f"{reference_ms / ms:5.2f}× {reference}'s speed"
    if difference is not None:
        row["largest_step_difference_vs_" + reference] = difference
        line += f"   step vs it {difference:.1e}"
    print(line)


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
    parser.add_argument("--budget", type=float, default=60,
                        help="seconds of timed calls per candidate, warm-up included, past which "
                             "it takes no more rounds (each takes one at least); 0: no limit")
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
    # Early and bounded, so that a bf16 candidate the budget stops can be told why.
    args.mm_rates = mm_rates(device)
    print(f"torch.mm {PROBE_SIZE}²: fp32 {gflops(args.mm_rates['float32'])}, "
          f"bf16 {gflops(args.mm_rates['bfloat16'])}; budget per candidate: "
          + (f"{args.budget:g} s" if args.budget > 0 else "none"))
    results = {"torch": torch.__version__, "device": name, "threads": torch.get_num_threads(),
               "layers": args.layers, "width": args.width, "mlp": args.mlp, "vocab": args.vocab,
               "run": dict(run_metadata(), budget_s=args.budget, torch_mm_gflops=dict(
                   args.mm_rates, size=PROBE_SIZE)),
               "muon": {}, "orthogonalize": {}, "adamw": {}}
    sections = {"muon": bench_muon, "orthogonalize": bench_orthogonalize, "adamw": bench_adamw}
    for name, bench in sections.items():
        if args.only in (None, name):
            bench(args, device, results)
    write_json(args.json, results)


if __name__ == "__main__":
    main()
