"""Optimizer steps on a GPT-shaped parameter set, muon_cpp against PyTorch, in one run.

    python3 bench/gpu_bench.py [--device cuda] [--layers 12] [--width 768] [--steps 20]

Muon (the hidden matrices: per layer q, k, v, o of width², an MLP up and down of 4·width²):
  muon_cpp.Muon (bf16 Newton–Schulz on the GPU, same-shape matrices batched), torch.optim.Muon
  (when this PyTorch has it, 2.9+) and a plain bf16 ATen Muon written here (a loop over the
  matrices, Keller Jordan's quintic). AdamW (every tensor, embedding and norms too):
  muon_cpp.AdamW (the device-generic multi-tensor form) against torch.optim.AdamW(fused=True)
  and (foreach=True).

Every step time is the median of --steps timed steps (CUDA events) after warm-up steps; every
"largest difference" is max |Δours − Δtheirs| / max |Δtheirs| of the parameter change after the
same first step from the same parameters and gradients. The result also goes to --json.
"""
import argparse
import json
import math
import statistics
import sys
import time

import torch

import muon_cpp

QUINTIC = (3.4445, -4.7750, 2.0315)


def gpt_shapes(layers, width, vocab):
    matrices, others = [], [(vocab, width), (width,)]
    for _ in range(layers):
        matrices += [(width, width)] * 4 + [(4 * width, width), (width, 4 * width)]
        others += [(width,), (width,)]
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


def synchronize(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def time_steps(step, device, steps, warmup):
    for _ in range(warmup):
        step()
    synchronize(device)
    times = []
    for _ in range(steps):
        if device.type == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            step()
            end.record()
            torch.cuda.synchronize(device)
            times.append(start.elapsed_time(end))
        else:
            begin = time.perf_counter()
            step()
            times.append((time.perf_counter() - begin) * 1e3)
    return statistics.median(times)


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


class PlainBf16Muon:
    """Muon as a loop of ATen operations in bf16: EMA momentum with Nesterov, the quintic
    Newton–Schulz on the smaller side, decoupled decay, lr·√max(1, rows/cols)."""

    def __init__(self, params, lr, momentum, weight_decay, steps=5):
        self.params, self.lr, self.momentum = params, lr, momentum
        self.weight_decay, self.steps = weight_decay, steps
        self.buffers = [torch.zeros_like(p) for p in params]

    def orthogonalize(self, g):
        X = g.bfloat16()
        tall = X.size(0) > X.size(1)
        if tall:
            X = X.mT
        X = X / (X.norm() + 1e-7)
        a, b, c = QUINTIC
        for _ in range(self.steps):
            A = X @ X.mT
            X = a * X + (b * A + c * A @ A) @ X
        return X.mT if tall else X

    @torch.no_grad()
    def step(self):
        for p, buf in zip(self.params, self.buffers):
            buf.lerp_(p.grad, 1 - self.momentum)
            update = self.orthogonalize(p.grad.lerp(buf, self.momentum))
            p.mul_(1 - self.lr * self.weight_decay)
            p.add_(update.to(p.dtype), alpha=-self.lr * math.sqrt(max(1.0, p.size(0) / p.size(1))))


def bench_muon(args, device, results):
    shapes, _ = gpt_shapes(args.layers, args.width, args.vocab)
    params = make_params(shapes, device, 0)
    settings = dict(lr=0.02, momentum=0.95, weight_decay=0.1)
    candidates = {
        "muon_cpp.Muon": lambda ps: muon_cpp.Muon(ps, nesterov=True, **settings),
        "plain bf16 ATen Muon": lambda ps: PlainBf16Muon(ps, **settings),
    }
    if hasattr(torch.optim, "Muon"):
        candidates["torch.optim.Muon"] = lambda ps: torch.optim.Muon(
            ps, nesterov=True, ns_coefficients=QUINTIC, eps=1e-7, ns_steps=5, **settings)
    else:
        print(f"torch.optim.Muon: not in torch {torch.__version__} (2.9+)")
    changes = {name: first_step_change(make, params) for name, make in candidates.items()}
    reference = "torch.optim.Muon" if "torch.optim.Muon" in candidates else "plain bf16 ATen Muon"
    print(f"\nMuon, {len(shapes)} matrices ({args.layers} layers × width {args.width}), "
          f"{sum(math.prod(s) for s in shapes) / 1e6:.1f}M parameters, {device}")
    times = {}
    for name, make in candidates.items():
        copies = clone_params(params)
        optimizer = make(copies)
        times[name] = time_steps(optimizer.step, device, args.steps, args.warmup)
    for name in candidates:
        row = {"step_ms": times[name],
               "vs_ours": times[name] / times["muon_cpp.Muon"],
               "largest_difference_vs_" + reference: largest_difference(changes[name],
                                                                         changes[reference])}
        results["muon"][name] = row
        print(f"  {name:24s} {times[name]:9.2f} ms/step   ours is {row['vs_ours']:.2f}× as fast"
              f"   largest difference vs {reference}: {row['largest_difference_vs_' + reference]:.2e}")


def bench_adamw(args, device, results):
    matrices, others = gpt_shapes(args.layers, args.width, args.vocab)
    shapes = matrices + others
    params = make_params(shapes, device, 1)
    settings = dict(lr=3e-4, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1)
    candidates = {"muon_cpp.AdamW": lambda ps: muon_cpp.AdamW(ps, **settings)}
    if device.type == "cuda":
        candidates["torch.optim.AdamW(fused=True)"] = lambda ps: torch.optim.AdamW(
            ps, fused=True, **settings)
    candidates["torch.optim.AdamW(foreach=True)"] = lambda ps: torch.optim.AdamW(
        ps, foreach=True, **settings)
    reference = next(name for name in candidates if name.startswith("torch"))
    changes = {name: first_step_change(make, params) for name, make in candidates.items()}
    count = sum(math.prod(s) for s in shapes)
    print(f"\nAdamW, {len(shapes)} tensors, {count / 1e6:.1f}M parameters, {device}")
    for name, make in candidates.items():
        copies = clone_params(params)
        optimizer = make(copies)
        ms = time_steps(optimizer.step, device, args.steps, args.warmup)
        # Bytes a single-pass step moves: read p, g, m, v; write p, m, v (fp32).
        bandwidth = 7 * 4 * count / (ms * 1e-3) / 1e9
        row = {"step_ms": ms, "effective_GB_per_s": bandwidth,
               "largest_difference_vs_" + reference: largest_difference(changes[name],
                                                                         changes[reference])}
        results["adamw"][name] = row
        print(f"  {name:32s} {ms:9.2f} ms/step  {bandwidth:7.0f} GB/s (7 passes' bytes)"
              f"   largest difference vs {reference}: {row['largest_difference_vs_' + reference]:.2e}")
    ours = results["adamw"]["muon_cpp.AdamW"]["step_ms"]
    for name, row in results["adamw"].items():
        row["vs_ours"] = row["step_ms"] / ours


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--layers", type=int, default=12)
    parser.add_argument("--width", type=int, default=768)
    parser.add_argument("--vocab", type=int, default=50304)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        sys.exit("gpu_bench: CUDA is not available to this PyTorch")
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU"
    print(f"gpu_bench: torch {torch.__version__}, {name}")
    results = {"torch": torch.__version__, "device": name, "layers": args.layers,
               "width": args.width, "muon": {}, "adamw": {}}
    bench_muon(args, device, results)
    bench_adamw(args, device, results)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=2)
        print(f"\nwrote {args.json}")


if __name__ == "__main__":
    main()
