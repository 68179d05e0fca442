"""Trains a small torch.nn classifier with muon_cpp: Muon on the hidden matrices, AdamW on the
embedding, biases and output layer, a warmup-then-cosine schedule from the YAML configuration,
and a checkpoint of the optimizer written with torch.save.

    PYTHONPATH=build/python /usr/bin/python3 examples/python/train_mlp.py [--steps 200]
"""
import argparse
import io

import torch
from torch import nn

import muon_cpp

CONFIG = """
optimizer:
  name: muon
  lr: 0.02          # Muon's rate
  adamw_lr: 0.003   # everything else
  weight_decay: 0.01
  grad_clip: 1.0
  schedule: {name: cosine, warmup_steps: 10}
"""


class Classifier(nn.Module):
    """Token sequences → one of `classes` labels: embedding, two hidden layers, an output head."""

    def __init__(self, vocab=32, width=64, classes=4):
        super().__init__()
        self.embed = nn.Embedding(vocab, width)
        self.hidden = nn.Sequential(nn.Linear(width, width), nn.GELU(), nn.LayerNorm(width),
                                    nn.Linear(width, width), nn.GELU())
        self.head = nn.Linear(width, classes)

    def forward(self, tokens):
        return self.head(self.hidden(self.embed(tokens).mean(dim=1)))


def make_data(count, vocab=32, length=8, classes=4, seed=0):
    """The label is the most frequent token's residue mod `classes`: learnable, not trivial."""
    generator = torch.Generator().manual_seed(seed)
    tokens = torch.randint(0, vocab, (count, length), generator=generator)
    labels = torch.mode(tokens % classes, dim=1).values
    return tokens, labels


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--batch-size", type=int, default=64)
    args = parser.parse_args()

    torch.manual_seed(0)
    model = Classifier()
    optimizer = muon_cpp.build_optimizer(model, CONFIG, total_steps=args.steps)
    print(optimizer.report_text())
    tokens, labels = make_data(args.steps * args.batch_size)
    test_tokens, test_labels = make_data(1024, seed=1)

    def test_loss():
        with torch.no_grad():
            return nn.functional.cross_entropy(model(test_tokens), test_labels).item()

    first = test_loss()
    for step in range(args.steps):
        batch = slice(step * args.batch_size, (step + 1) * args.batch_size)
        optimizer.zero_grad()
        loss = nn.functional.cross_entropy(model(tokens[batch]), labels[batch])
        loss.backward()
        optimizer.step()
        if step % 50 == 0 or step == args.steps - 1:
            lr = max(group["lr"] for group in optimizer.param_groups)
            print(f"step {step:4d}  loss {loss.item():.4f}  muon lr {lr:.5f}  "
                  f"grad norm {optimizer.last_step['grad_norm']:.3f}")
    last = test_loss()
    accuracy = (model(test_tokens).argmax(dim=1) == test_labels).float().mean().item()
    print(f"test loss {first:.4f} -> {last:.4f}, accuracy {accuracy:.1%}")

    checkpoint = io.BytesIO()  # a file path works the same way
    torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict()}, checkpoint)
    print(f"checkpoint: {checkpoint.tell() / 1024:.0f} KiB")
    if not last < 0.8 * first:
        raise SystemExit("training did not reduce the test loss by 20%")


if __name__ == "__main__":
    main()
