"""The step inside backward (muon_cpp.step_in_backward): a training step's peak memory and time,
beside the ordinary step and torch's optimizers, in one run.

    python3 bench/step_in_backward.py [--threads N] [--layers 4] [--width 768] [--vocab 256]
                                      [--batch 1] [--seq 32] [--steps 10] [--budget 60]
                                      [--json FILE]

The model is a GPT of 4 layers of width 768 (the hidden matrices of the set bench/torch_peers.py
uses) over the demo model's byte vocabulary (256; the embedding tied to the output), 28.5M
parameters, trained on random tokens at a batch small enough that activations are a few percent
of the peak. (With a 50304-token vocabulary the embedding holds 58% of the parameters, and its
gradient — one tensor, whole at once in either form — alone is 2.3 bytes per parameter.)
Candidates: torch.optim.AdamW(fused=True) on every tensor; torch.optim.Muon on the hidden
matrices with it on the rest (where torch has Muon); muon_cpp's hybrid (Muon with bf16
Newton–Schulz as torch's, AdamW for the rest, nonfinite: ignore) with float32 and int8 state,
each with the ordinary step and inside backward.

Memory is measured in a fresh process per candidate (this script with --child): after one step of
a small model with the same optimizer (the imports and set-up any first step costs), the resident
set (VmRSS), then its peak (VmHWM) over four training steps of the model; the figure is the
peak's growth per parameter — weights, gradients, state, workspaces and activations together. "forward and backward" is the same without an optimizer (gradients kept): weights,
gradients and activations alone. Step times (forward, backward and update) come from one
process, in alternating rounds (bench/peer_timing.py).
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
from peer_timing import gflops, median_times, mm_rates, record
from state_memory import status_bytes


class Norm(torch.nn.Module):
    def __init__(self, width):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.ones(width))

    def forward(self, x):
        return x * torch.rsqrt(x.square().mean(-1, keepdim=True) + 1e-6) * self.weight


class Block(torch.nn.Module):
    def __init__(self, width, heads):
        super().__init__()
        self.heads = heads
        self.norm1, self.norm2 = Norm(width), Norm(width)
        self.q, self.k, self.v, self.o = (torch.nn.Linear(width, width, bias=False)
                                          for _ in range(4))
        self.up = torch.nn.Linear(width, 4 * width, bias=False)
        self.down = torch.nn.Linear(4 * width, width, bias=False)

    def forward(self, x):
        b, t, c = x.shape
        h = self.norm1(x)
        q, k, v = (f(h).view(b, t, self.heads, c // self.heads).transpose(1, 2)
                   for f in (self.q, self.k, self.v))
        scores = (q @ k.transpose(-1, -2)) / math.sqrt(c // self.heads)
        mask = torch.ones(t, t, dtype=torch.bool).triu(1)
        attention = scores.masked_fill(mask, float("-inf")).softmax(-1) @ v
        x = x + self.o(attention.transpose(1, 2).reshape(b, t, c))
        return x + self.down(torch.nn.functional.gelu(self.up(self.norm2(x))))


class Gpt(torch.nn.Module):
    def __init__(self, layers, width, vocab):
        super().__init__()
        self.embedding = torch.nn.Embedding(vocab, width)
        self.blocks = torch.nn.ModuleList(Block(width, width // 64) for _ in range(layers))
        self.norm = Norm(width)

    def forward(self, tokens):
        x = self.embedding(tokens)
        for block in self.blocks:
            x = block(x)
        return self.norm(x) @ self.embedding.weight.t()  # tied output


HYBRID = ("optimizer: {{name: muon, lr: 0.02, adamw_lr: 3e-4, ns_dtype: bfloat16, nonfinite: ignore, "
          "state_dtype: {}}}\n")


def hybrid(state_dtype, in_backward):
    def make(model):
        optimizer = muon_cpp.build_optimizer(model, HYBRID.format(state_dtype))
        if in_backward:
            muon_cpp.step_in_backward(optimizer)
        return [optimizer]
    return make


def torch_muon(model):
    matrices = [p for name, p in model.named_parameters() if name.startswith("blocks.") and p.ndim == 2]
    rest = [p for name, p in model.named_parameters() if not (name.startswith("blocks.") and p.ndim == 2)]
    return [torch.optim.Muon(matrices, lr=0.02), torch.optim.AdamW(rest, lr=3e-4, fused=True)]


def candidates():
    out = {"forward and backward": lambda model: [],
           "torch.optim.AdamW(fused=True)":
               lambda model: [torch.optim.AdamW(model.parameters(), lr=3e-4, fused=True)]}
    if hasattr(torch.optim, "Muon"):
        out["torch.optim.Muon + AdamW(fused=True)"] = torch_muon
    for state in ("float32", "int8"):
        out[f"muon_cpp {state} state"] = hybrid(state, False)
        out[f"muon_cpp {state} state, step inside backward"] = hybrid(state, True)
    return out


def training_step(model, optimizers, tokens):
    """One step as a training loop writes it: the same loop for both forms."""
    loss = torch.nn.functional.cross_entropy(model(tokens[:, :-1]).flatten(0, 1),
                                             tokens[:, 1:].flatten())
    loss.backward()
    for optimizer in optimizers:
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)


def model_and_tokens(args):
    torch.manual_seed(1)
    model = Gpt(args.layers, args.width, args.vocab)
    tokens = torch.randint(0, args.vocab, (args.batch, args.seq + 1),
                           generator=torch.Generator().manual_seed(2))
    return model, tokens


def steps(model, optimizers, tokens, count):
    for _ in range(count):
        if optimizers:
            training_step(model, optimizers, tokens)
        else:  # forward and backward alone: the gradients stay, as before a step
            model.zero_grad(set_to_none=True)
            torch.nn.functional.cross_entropy(model(tokens[:, :-1]).flatten(0, 1),
                                              tokens[:, 1:].flatten()).backward()


def child(args):
    """One candidate's peak, printed as JSON. A step of a one-layer model of width 64 first, so
    that what the first step of any model costs — the imports torch.optim makes when an optimizer
    is built, kernels and thread pools set up — is in the baseline, not counted per parameter."""
    torch.set_num_threads(args.threads)
    make = candidates()[args.child]
    tiny = argparse.Namespace(**dict(vars(args), layers=1, width=64))
    model, tokens = model_and_tokens(tiny)
    steps(model, make(model), tokens, 1)
    del model
    before = status_bytes("VmRSS")
    model, tokens = model_and_tokens(args)
    steps(model, make(model), tokens, 4)
    count = sum(p.numel() for p in model.parameters())
    peak = status_bytes("VmHWM")
    print(json.dumps({"peak_MB": (peak - before) / 2 ** 20,
                      "peak_bytes_per_param": (peak - before) / count}))


def measure_memory(args, name):
    command = [sys.executable, os.path.abspath(__file__), "--child", name]
    for flag in ("threads", "layers", "width", "vocab", "batch", "seq"):
        command += [f"--{flag}", str(getattr(args, flag))]
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode != 0:
        lines = [line for line in done.stderr.strip().splitlines() if line.strip()]
        return {"error": lines[-1] if lines else f"exit status {done.returncode}"}
    return json.loads(done.stdout.strip().splitlines()[-1])


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--threads", type=int, default=os.cpu_count())
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--width", type=int, default=768)
    parser.add_argument("--vocab", type=int, default=256)
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--seq", type=int, default=32)
    parser.add_argument("--steps", type=int, default=10, help="timed rounds")
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--budget", type=float, default=60)
    parser.add_argument("--json", default=None)
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args)
        return
    meta = run_metadata()  # the date and the load when the run begins
    torch.set_num_threads(args.threads)
    args.mm_rates = mm_rates(torch.device("cpu"))
    model, _ = model_and_tokens(args)
    count = sum(p.numel() for p in model.parameters())
    del model
    print(f"step_in_backward: torch {torch.__version__}, {cpu_name()}, {args.threads} threads; "
          f"GPT {args.layers}x{args.width}, vocab {args.vocab}, {count / 1e6:.1f}M parameters, "
          f"batch {args.batch}x{args.seq} tokens; torch.mm fp32 "
          f"{gflops(args.mm_rates['float32'])}")
    rows = {}
    steps = {}
    for name, make in candidates().items():
        rows[name] = measure_memory(args, name)
        if "error" in rows[name] or name == "forward and backward":
            continue
        model, tokens = model_and_tokens(args)
        optimizers = make(model)
        steps[name] = lambda model=model, optimizers=optimizers, tokens=tokens: \
            training_step(model, optimizers, tokens)
    runs = median_times(steps, torch.device("cpu"), args)
    ordinary = {f"muon_cpp {s} state": f"muon_cpp {s} state, step inside backward"
                for s in ("float32", "int8")}
    fused = runs.get("torch.optim.AdamW(fused=True)")
    for name, row in rows.items():
        line = f"  {name:46s} "
        line += (f"peak {row['peak_MB']:7.0f} MB ({row['peak_bytes_per_param']:5.2f} B/param)"
                 if "error" not in row else f"not run: {row['error']}")
        run = runs.get(name)
        if run is not None:
            row["step_ms"] = run.ms
            record(name, run, row)
            if run.ms is not None:
                line += f"   {run.ms:8.1f} ms/step"
                if fused is not None and fused.ms is not None:
                    row["speed_vs_fused_adamw"] = fused.ms / run.ms
        print(line)
    for plain, inside in ordinary.items():
        if runs.get(plain) and runs.get(inside) and runs[plain].ms and runs[inside].ms:
            rows[inside]["time_vs_ordinary"] = runs[inside].ms / runs[plain].ms
            saved = rows[plain]["peak_bytes_per_param"] - rows[inside]["peak_bytes_per_param"]
            rows[inside]["bytes_per_param_saved"] = saved
            print(f"  {inside}: {rows[inside]['time_vs_ordinary']:.3f}x the ordinary step's time, "
                  f"{saved:.2f} B/param less at peak")
    if "forward and backward" in rows and "error" not in rows["forward and backward"]:
        activations = rows["forward and backward"]["peak_bytes_per_param"] - 8  # weights, grads
        for row in rows.values():
            if "peak_bytes_per_param" in row:
                row["activations_share"] = activations / row["peak_bytes_per_param"]
        print(f"  activations: about {activations:.2f} B/param (forward and backward's peak "
              "less the weights and gradients)")
    write_json(args.json, dict(torch=torch.__version__, device=cpu_name(), threads=args.threads,
                               layers=args.layers, width=args.width, vocab=args.vocab,
                               batch=args.batch, seq=args.seq, parameters=count,
                               run=meta, candidates=rows))


if __name__ == "__main__":
    main()
