"""How much each 8-bit map and block size loses of real optimizer state: the float32 state of a
`muon train` checkpoint quantized block-wise and read back, for block sizes 64 to 4096 and three
maps — muon_cpp's (sign + E4M3 for momentum and first moments, E5M3 for second moments), the
dynamic-tree map of bitsandbytes and torchao (Dettmers et al., arXiv 2110.02861; taken from bitsandbytes where it is installed), and a
linear one.

    python3 bench/state_blocks.py CHECKPOINT [--json FILE]

CHECKPOINT: a run's checkpoint.pt with float32 state (`muon train --state-dtype float32`).
Figures: for Muon's momentum, ‖m̂ − m‖/‖m‖ over every matrix; for the Adam moments, the error of
the update direction they give, ‖û − u‖/‖u‖ with u = m/(√v + 1e-8), both moments quantized; and
the share of non-zero elements each map reads back as zero (momentum; second moment).
Elements go into blocks along each tensor's rows, as muon_cpp cuts them (a row's last block
shorter); tensors under 4096 elements or of rank 1 are left out, as muon_cpp keeps them whole.
"""
import argparse

import torch

from peer_machine import write_json

TOP = 1.875


def float_map(signed):
    """muon_cpp's maps (include/muon/quantize.h), as sorted float64 values in [−1, 1]."""
    bias = 15 if signed else 31
    values = []
    for code in range(128 if signed else 256):
        exponent, mantissa = code // 8, code % 8
        values.append(mantissa / 8 * 2.0 ** (1 - bias) if exponent == 0
                      else (1 + mantissa / 8) * 2.0 ** (exponent - bias))
    values = torch.tensor(values, dtype=torch.float64) / TOP
    return torch.cat([-values.flip(0), values]).unique() if signed else values


def dynamic_map(signed):
    """The dynamic-tree map as bitsandbytes builds it (its AdamW8bit's; torchao's is the same)."""
    from bitsandbytes.functional import create_dynamic_map
    return create_dynamic_map(signed=signed).double().sort().values


def linear_map(signed):
    return (torch.arange(-127, 128) / 127 if signed else torch.arange(256) / 255).double()


MAPS = {"muon_cpp float (E4M3 / E5M3)": float_map, "dynamic tree (bitsandbytes, torchao)":
        dynamic_map, "linear": linear_map}


def quantized(x, table, block):
    """x read back after block-wise absmax quantization to the nearest entry of `table`."""
    rows = x.double().reshape(x.shape[0], -1)
    length = rows.shape[1]
    padded = torch.nn.functional.pad(rows, (0, (-length) % block))
    blocks = padded.reshape(rows.shape[0], -1, block)
    scale = blocks.abs().amax(-1, keepdim=True)
    y = torch.where(scale > 0, blocks / scale, torch.zeros_like(blocks))
    upper = torch.bucketize(y, table).clamp(1, len(table) - 1)
    nearer_lower = (y - table[upper - 1]) < (table[upper] - y)
    index = torch.where(nearer_lower, upper - 1, upper)
    back = (table[index] * scale).reshape(rows.shape[0], -1)[:, :length]
    return back.reshape(x.shape)


def relative(approx, exact):
    return (torch.linalg.vector_norm(approx - exact) / torch.linalg.vector_norm(exact)).item()


def flushed(approx, exact):
    """The share of non-zero elements read back as zero: small values a map cannot hold."""
    nonzero = exact != 0
    return ((approx == 0) & nonzero).sum().item() / max(1, nonzero.sum().item())


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("checkpoint")
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    state = torch.load(args.checkpoint, map_location="cpu", weights_only=False)["state"]
    momenta, moments = [], []
    for entry in state.values():
        if "momentum_buffer" in entry and entry["momentum_buffer"].numel() >= 4096:
            momenta.append(entry["momentum_buffer"])
        if "exp_avg" in entry and entry["exp_avg"].dim() >= 2 and entry["exp_avg"].numel() >= 4096:
            moments.append((entry["exp_avg"], entry["exp_avg_sq"]))
    print(f"{args.checkpoint}: {len(momenta)} Muon momenta, {len(moments)} Adam moment pairs")
    results = {"checkpoint": args.checkpoint}
    for name, make in MAPS.items():
        try:
            signed, unsigned = make(True), make(False)
        except ImportError as e:
            print(f"  {name}: not measured ({e})")
            continue
        for block in (64, 256, 2048, 4096):
            m_error = sum(relative(quantized(m, signed, block), m.double()) for m in momenta)
            m_flushed = sum(flushed(quantized(m, signed, block), m.double()) for m in momenta)
            v_flushed = sum(flushed(quantized(v, unsigned, block), v.double()) for _, v in moments)
            u_error = 0.0
            for m, v in moments:
                exact = m.double() / (v.double().sqrt() + 1e-8)
                approx = quantized(m, signed, block) / (quantized(v, unsigned, block).sqrt() + 1e-8)
                u_error += relative(approx, exact)
            row = {"momentum": m_error / max(1, len(momenta)),
                   "momentum_flushed": m_flushed / max(1, len(momenta)),
                   "adam_update": u_error / max(1, len(moments)),
                   "second_moment_flushed": v_flushed / max(1, len(moments))}
            for key, value in row.items():
                results.setdefault(key, {}).setdefault(name, {})[block] = value
            print(f"  {name:38s} block {block:5d}: Muon momentum {100 * row['momentum']:6.2f}% "
                  f"({100 * row['momentum_flushed']:5.2f}% to 0)   Adam update "
                  f"{100 * row['adam_update']:6.2f}% (v: {100 * row['second_moment_flushed']:5.2f}%"
                  " to 0)")
    write_json(args.json, results)


if __name__ == "__main__":
    main()
