"""Models and references shared by the muon_cpp tests."""
import math

import torch
from torch import nn
from torch.optim import Optimizer


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

def reference_newton_schulz(X, steps=5, abc=(3.4445, -4.7750, 2.0315), eps=0.0):
    """eps 0: X / ‖X‖_F, muon-cpp's normalization unless ns_eps is set."""
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


# torch.optim.Muon's default Newton–Schulz row and Gram schedule (torch/optim/_muon.py).
QUINTIC = (3.4445, -4.775, 2.0315)
DEFAULT_GRAM = [list(QUINTIC)] * 5


class TranscribedMuon(Optimizer):
    """torch.optim.Muon as PyTorch's torch/optim/_muon.py writes it (the release with the Gram
    keywords), transcribed as a torch.optim.Optimizer — so it keeps torch's param-group keys and
    state-dict behaviour on any PyTorch — computing in the parameter's dtype instead of bfloat16
    (standard path) and float16 (Gram path). ``exact_eps=False`` divides by ‖X‖_F + eps on the
    standard path as muon-cpp does (torch: max(‖X‖_F, eps)); the Gram path does so in torch too."""

    def __init__(self, params, lr=1e-3, weight_decay=0.1, momentum=0.95, nesterov=True,
                 ns_coefficients=QUINTIC, eps=1e-7, ns_steps=5, adjust_lr_fn=None,
                 use_gram_newton_schulz=False, gram_newton_schulz_config=None, exact_eps=False):
        config = gram_newton_schulz_config or {}
        defaults = dict(lr=lr, weight_decay=weight_decay, momentum=momentum, nesterov=nesterov,
                        ns_coefficients=ns_coefficients, eps=eps, ns_steps=ns_steps,
                        adjust_lr_fn=adjust_lr_fn, use_gram_newton_schulz=use_gram_newton_schulz,
                        gram_ns_coefficients=config.get("gram_ns_coefficients", DEFAULT_GRAM),
                        gram_ns_reset_iterations=config.get("gram_ns_reset_iterations", []),
                        use_cuda_graph=config.get("use_cuda_graph", False))
        self.exact_eps = exact_eps
        super().__init__(params, defaults)

    def standard(self, grad, group):
        a, b, c = group["ns_coefficients"]
        x = grad.T if grad.size(0) > grad.size(1) else grad
        norm = x.norm()
        x = x / (norm.clamp(min=group["eps"]) if self.exact_eps else norm + group["eps"])
        for _ in range(group["ns_steps"]):
            gram = x @ x.T
            x = a * x + (b * gram + c * gram @ gram) @ x
        return x.T if grad.size(0) > grad.size(1) else x

    def gram(self, grad, group):
        """Works on R = X·Xᵀ and accumulates Q with X_k = Q·X_0, restarting from X = Q·X before
        each iteration listed in gram_ns_reset_iterations (but the first)."""
        x = grad.T if grad.size(0) > grad.size(1) else grad
        x = x / (x.norm() + group["eps"])
        eye = torch.eye(x.size(0), dtype=x.dtype)
        resets = group["gram_ns_reset_iterations"]
        r, q = x @ x.T, eye
        for i, (a, b, c) in enumerate(group["gram_ns_coefficients"]):
            if i in resets and i != 0:
                x, r, q = q @ x, None, eye
                r = x @ x.T
            z = b * r + c * r @ r
            q = z + a * eye if (i == 0 or i in resets) else a * q + q @ z
            r = (a * eye + z) @ r @ (a * eye + z)
        x = q @ x
        return x.T if grad.size(0) > grad.size(1) else x

    @torch.no_grad()
    def step(self):
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is None:
                    continue
                buf = self.state[p].setdefault("momentum_buffer", torch.zeros_like(p))
                buf.lerp_(p.grad, 1 - group["momentum"])
                update = p.grad.lerp(buf, group["momentum"]) if group["nesterov"] else buf
                square = p.size(0) == p.size(1)
                update = (self.gram(update, group) if group["use_gram_newton_schulz"]
                          and not square else self.standard(update, group))
                rows, cols = p.shape
                ratio = (math.sqrt(max(1, rows / cols)) if group["adjust_lr_fn"] in
                         (None, "original") else 0.2 * math.sqrt(max(rows, cols)))
                p.mul_(1 - group["lr"] * group["weight_decay"])
                p.add_(update, alpha=-group["lr"] * ratio)


class NoAttention:
    """A QK-clip source for models without attention (TinyGpt): no heads, no logits."""

    def qk_clip_targets(self):
        return []

    def qk_max_logits(self):
        return {}
