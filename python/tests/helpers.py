"""Models and references shared by the muon_cpp tests."""
import math

import torch
from torch import nn


class Block(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.norm = nn.LayerNorm(d)
        self.q_proj = nn.Linear(d, d, bias=False)
        self.k_proj = nn.Linear(d, d, bias=False)
        self.up_proj = nn.Linear(d, 2 * d)
        self.down_proj = nn.Linear(2 * d, d)

    def forward(self, x):
        h = self.norm(x)
        attention = torch.softmax(self.q_proj(h) @ self.k_proj(h).transpose(-1, -2), dim=-1) @ h
        return x + attention + self.down_proj(torch.relu(self.up_proj(h)))


class TinyGpt(nn.Module):
    """Embedding tied to the output head, two blocks, a frozen positional table."""

    def __init__(self, vocab=17, d=12, layers=2, length=6):
        super().__init__()
        self.wte = nn.Embedding(vocab, d)
        self.pos = nn.Parameter(torch.randn(length, d) * 0.1, requires_grad=False)
        self.blocks = nn.ModuleList(Block(d) for _ in range(layers))
        self.norm_f = nn.LayerNorm(d)
        self.lm_head = nn.Linear(d, vocab, bias=False)
        self.lm_head.weight = self.wte.weight

    def forward(self, tokens):
        x = self.wte(tokens) + self.pos[: tokens.shape[-1]]
        for block in self.blocks:
            x = block(x)
        return self.lm_head(self.norm_f(x))

    def loss(self, tokens):
        logits = self(tokens[:, :-1])
        return nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]),
                                           tokens[:, 1:].reshape(-1))


def batches(count, vocab=17, batch=4, length=6, seed=0):
    generator = torch.Generator().manual_seed(seed)
    return [torch.randint(0, vocab, (batch, length + 1), generator=generator)
            for _ in range(count)]


def train(model, optimizer, data, scheduler=None):
    for tokens in data:
        optimizer.zero_grad()
        model.loss(tokens).backward()
        optimizer.step()
        if scheduler is not None:
            scheduler.step()


def weights(model):
    return [p.detach().clone() for p in model.parameters()]


def max_rel_diff(a, b):
    a, b = a.double(), b.double()
    return ((a - b).abs().max() / b.abs().max().clamp_min(1e-300)).item()


# ---- Muon as docs/design.md §Muon update states it (quintic Newton–Schulz, no fast paths) ----

def reference_newton_schulz(X, steps=5, abc=(3.4445, -4.7750, 2.0315), eps=1e-7):
    tall = X.shape[0] > X.shape[1]
    if tall:
        X = X.T
    X = X / (X.norm() + eps)
    a, b, c = abc
    for _ in range(steps):
        A = X @ X.T
        X = a * X + (b * A + c * A @ A) @ X
    return X.T if tall else X


class ReferenceMuon:
    def __init__(self, lr, momentum=0.95, nesterov=True, weight_decay=0.0, momentum_form="ema",
                 adjust_lr="original"):
        self.lr, self.beta, self.nesterov = lr, momentum, nesterov
        self.weight_decay, self.form, self.adjust_lr = weight_decay, momentum_form, adjust_lr
        self.buffers = {}

    def factor(self, rows, cols):
        return {"original": math.sqrt(max(1.0, rows / cols)),
                "match_rms_adamw": 0.2 * math.sqrt(max(rows, cols)),
                "spectral": math.sqrt(rows / cols),
                "none": 1.0}[self.adjust_lr]

    @torch.no_grad()
    def step(self, params):
        for p in params:
            g = p.grad
            B = self.buffers.setdefault(id(p), torch.zeros_like(g))
            if self.form == "ema":
                B.mul_(self.beta).add_((1 - self.beta) * g)
                Q = torch.lerp(g, B, self.beta) if self.nesterov else B
            else:
                B.mul_(self.beta).add_(g)
                Q = g + self.beta * B if self.nesterov else B
            U = reference_newton_schulz(Q)
            p.mul_(1 - self.lr * self.weight_decay)
            p.sub_(self.lr * self.factor(*p.shape) * U)
