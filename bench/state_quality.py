"""Does low-precision optimizer state keep the loss? The demo GPT (`muon train`: the King James
Bible, byte level) trained under the same seeds with float32, bfloat16 and int8 state, by the
hybrid (Muon + AdamW) and by AdamW alone; final validation losses side by side, and the curves.

    python3 bench/state_quality.py [--muon build/muon] [--steps 400] [--seeds 1 2] [--jobs 2]
        [--optimizers muon adamw] [--dtypes float32 bfloat16 int8] [--out runs/state-quality]
        [--json FILE] [--svg FILE]

Each run is `muon train --steps N --seed S --optimizer O --state-dtype D --threads 1`; --jobs
runs go at once (one thread each). A run whose directory holds its final row already is read
back, not trained again, so the command continues an interrupted sweep.
"""
import argparse
import csv
import pathlib
import statistics
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

from peer_machine import cpu_name, run_metadata, write_json

DTYPES = ["float32", "bfloat16", "int8"]
OPTIMIZERS = {"muon": "hybrid (Muon + AdamW)", "adamw": "AdamW alone"}
COLOURS = {"float32": "#1f77b4", "bfloat16": "#ff7f0e", "int8": "#2ca02c"}


def curve(run_dir):
    """[(step, val loss)] of a run's metrics.csv, or [] before it has any."""
    path = run_dir / "metrics.csv"
    if not path.exists():
        return []
    with open(path) as f:
        return [(int(r["step"]), float(r["val_loss"])) for r in csv.DictReader(f) if r["val_loss"]]


def train(args, optimizer, dtype, seed):
    run_dir = args.out / f"{optimizer}-{dtype}-seed{seed}"
    points = curve(run_dir)
    if not points or points[-1][0] != args.steps:
        command = [args.muon, "train", "--steps", str(args.steps), "--seed", str(seed),
                   "--optimizer", optimizer, "--state-dtype", dtype, "--threads", "1",
                   "--eval-every", str(args.eval_every), "--out", str(run_dir), "--overwrite"]
        print(" ".join(command), flush=True)
        subprocess.run(command, check=True, stdout=subprocess.DEVNULL)
        points = curve(run_dir)
    return points


def svg(results, steps, optimizers, dtypes):
    """A panel per optimizer (hybrid, AdamW): mean validation loss over the seeds against step."""
    width, height, pad = 360, 260, 40
    parts = []
    for panel, optimizer in enumerate(optimizers):
        title = OPTIMIZERS[optimizer]
        curves = {d: results[optimizer][d]["mean_curve"] for d in dtypes}
        values = [v for c in curves.values() for _, v in c if _ >= steps * 0.25]
        low, high = min(values), max(values)
        x0 = panel * (width + pad) + pad

        def point(step, value):
            x = x0 + step / steps * width
            y = pad + (1 - (min(value, high) - low) / (high - low)) * height
            return f"{x:.1f},{y:.1f}"

        parts.append(f'<text x="{x0}" y="{pad - 12}" font-size="13">{title}: validation loss '
                     f'({low:.3f}–{high:.3f})</text>')
        parts.append(f'<rect x="{x0}" y="{pad}" width="{width}" height="{height}" fill="none" '
                     f'stroke="#999"/>')
        for i, dtype in enumerate(dtypes):
            shown = [(s, v) for s, v in curves[dtype] if s >= steps * 0.25]
            line = " ".join(point(s, v) for s, v in shown)
            parts.append(f'<polyline points="{line}" fill="none" stroke="{COLOURS[dtype]}" '
                         f'stroke-width="1.5"/>')
            parts.append(f'<text x="{x0 + width - 150}" y="{pad + 18 + 16 * i}" font-size="12" '
                         f'fill="{COLOURS[dtype]}">{dtype} state: '
                         f'{results[optimizer][dtype]["mean_final"]:.4f}</text>')
        parts.append(f'<text x="{x0}" y="{pad + height + 16}" font-size="11">step {steps // 4}'
                     f'</text><text x="{x0 + width - 50}" y="{pad + height + 16}" '
                     f'font-size="11">step {steps}</text>')
    total = len(optimizers) * (width + pad) + pad
    return (f'<svg xmlns="http://www.w3.org/2000/svg" width="{total}" height="{height + 2 * pad}"'
            f' font-family="sans-serif">\n' + "\n".join(parts) + "\n</svg>\n")


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--muon", default="build/muon")
    parser.add_argument("--steps", type=int, default=400)
    parser.add_argument("--eval-every", type=int, default=25)
    parser.add_argument("--seeds", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--optimizers", nargs="+", choices=list(OPTIMIZERS), default=list(OPTIMIZERS))
    parser.add_argument("--dtypes", nargs="+", choices=DTYPES, default=DTYPES)
    parser.add_argument("--out", type=pathlib.Path, default=pathlib.Path("runs/state-quality"))
    parser.add_argument("--json", default=None)
    parser.add_argument("--svg", default=None)
    args = parser.parse_args()
    if "float32" not in args.dtypes:
        parser.error("--dtypes: float32 is the reference the others are compared with")
    runs = [(o, d, s) for o in args.optimizers for d in args.dtypes for s in args.seeds]
    with ThreadPoolExecutor(args.jobs) as pool:
        curves = dict(zip(runs, pool.map(lambda r: train(args, *r), runs)))
    results = {"cpu": cpu_name(), "steps": args.steps, "seeds": args.seeds,
               "command": " ".join(["python3"] + sys.argv), "run": run_metadata()}
    for optimizer in args.optimizers:
        title = OPTIMIZERS[optimizer]
        results[optimizer] = {}
        print(f"\n{title}, {args.steps} steps: final validation loss")
        for dtype in args.dtypes:
            finals = [curves[(optimizer, dtype, s)][-1][1] for s in args.seeds]
            steps = [s for s, _ in curves[(optimizer, dtype, args.seeds[0])]]
            mean_curve = [(step, statistics.mean(dict(curves[(optimizer, dtype, s)])[step]
                                                 for s in args.seeds)) for step in steps]
            results[optimizer][dtype] = {"final_by_seed": finals,
                                         "mean_final": statistics.mean(finals),
                                         "mean_curve": mean_curve}
        base = results[optimizer]["float32"]["mean_final"]
        for dtype in args.dtypes:
            row = results[optimizer][dtype]
            row["vs_float32"] = row["mean_final"] / base - 1
            seeds = "  ".join(f"{v:.4f}" for v in row["final_by_seed"])
            print(f"  {dtype:9s} seeds {seeds}   mean {row['mean_final']:.4f}   "
                  f"{100 * row['vs_float32']:+.2f}% vs float32")
    write_json(args.json, results)
    if args.svg:
        with open(args.svg, "w") as f:
            f.write(svg(results, args.steps, args.optimizers, args.dtypes))
        print(f"wrote {args.svg}")


if __name__ == "__main__":
    main()
