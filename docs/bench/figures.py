"""The speed tables of README.md and docs/benchmarks.md, generated from the recorded benchmark
runs under docs/bench/ (one directory per CPU class; docs/bench/classes.json says which files and
where each run came from).

    python3 docs/bench/figures.py            # print every table
    python3 docs/bench/figures.py --check    # exit 1 when a table in the docs differs from the JSON
    python3 docs/bench/figures.py --write    # rewrite the tables in README.md and docs/benchmarks.md

A table sits between `<!-- figures: NAME ... -->` and `<!-- /figures: NAME -->`; only this script
writes it. Plain Python (json, re): no torch, no build needed.
"""
import json
import pathlib
import re
import sys

BENCH = pathlib.Path(__file__).resolve().parent
ROOT = BENCH.parents[1]
DOCS = {"README.md": ["summary", "state", "backward"],
        "docs/benchmarks.md": ["summary", "state", "backward", "cli"]}
PEER_MUON = "torch.optim.Muon"
PEER_ADAMW = "torch.optim.AdamW(fused=True)"


def load(path):
    with open(path) as f:
        return json.load(f)


def classes():
    """The CPU classes in table order, each with its recorded runs loaded."""
    manifest = load(BENCH / "classes.json")
    out = []
    for entry in manifest["classes"]:
        runs = {}
        for name, meta in entry["runs"].items():
            data = load(BENCH / entry["id"] / name)
            meta = dict(meta, **{k: v for k, v in data.get("run", {}).items()
                                 if k in ("date", "commit")})
            runs[name] = (data, meta)
        out.append(dict(entry, runs=runs))
    return out


def ratio(x):
    return f"{x:.2f}×"


def ms(x):
    if x is None:
        return "—"
    return f"{x:.0f} ms" if x >= 100 else f"{x:.1f} ms"


def step_figure(row):
    """A candidate's step time, marked where the run's time budget stopped it short of its rounds
    (its median is over the steps it made)."""
    text = ms(row["step_ms"])
    if row.get("stopped"):
        n = row.get("timed_steps", 1)
        text += f" ({n} step{'' if n == 1 else 's'}, stopped)"
    return text


def timed(row):
    """Whether a candidate's row has a figure: one that raised has only its error."""
    return bool(row) and "error" not in row


def when(meta, section=None):
    commit = meta.get("section_commits", {}).get(section, meta["commit"])
    return f"{meta['date'][:10]}, {commit}"


def shape_set(data):
    per_layer = 7 if data["mlp"] == "swiglu" else 6
    return (f"{data['layers']} × {data['width']} ({data['layers'] * per_layer} matrices, "
            f"{data['mlp']} MLP)")


def adamw_parameters(data):
    """bench/torch_peers.py's AdamW set: the matrices, a vocab × width embedding and the norms."""
    layers, width, vocab = data["layers"], data["width"], data.get("vocab", 50304)
    mlp = (3 if data["mlp"] == "swiglu" else 2) * 4 * width * width
    return layers * (4 * width * width + mlp) + vocab * width + width + 2 * width * layers


def summary_rows(cls):
    """(step, muon-cpp, peer, ratio, run) rows of one class: each muon-cpp figure beside the
    strongest peer that class's runs measured."""
    rows = []
    peers = [(d, m) for name, (d, m) in cls["runs"].items() if name.startswith("torch-peers")]
    for data, meta in peers:
        muon = data.get("muon", {})
        peer = muon.get(PEER_MUON)
        for dtype, label in (("bfloat16", "bf16"), ("float32", "fp32")):
            ours = muon.get(f"muon_cpp.Muon {dtype}")
            if timed(ours) and timed(peer):
                rows.append((f"Muon step, {label} Newton–Schulz, {shape_set(data)}",
                             step_figure(ours), f"{PEER_MUON} (bf16) {step_figure(peer)}",
                             ratio(ours[f"speed_vs_{PEER_MUON}"]), when(meta, "muon")))
    for data, meta in peers:
        adamw = data.get("adamw", {})
        peer, ours = adamw.get(PEER_ADAMW), adamw.get("muon_cpp.AdamW")
        if timed(ours) and timed(peer):
            rows.append((f"AdamW step, {adamw_parameters(data) / 1e6:.1f}M parameters (the "
                         f"{data['layers']} × {data['width']} set, embedding and norms)",
                         step_figure(ours), f"{PEER_ADAMW} {step_figure(peer)}",
                         ratio(ours[f"speed_vs_{PEER_ADAMW}"]), when(meta, "adamw")))
    if not peers and "muon-bench.json" in cls["runs"]:
        data, meta = cls["runs"]["muon-bench.json"]
        step = data["muon_step"]
        rows.append((f"Muon step, fp32, {step['matrices']} matrices of 4 × 768 (`muon bench`)",
                     ms(step["ours_ms"]), f"the same step in plain ATen {ms(step['plain_ms'])}",
                     ratio(step["speedup"]), when(meta)))
        torch_row = next(r for r in data["adamw"] if r["name"] == "torch::optim::AdamW")
        ours = next(r for r in data["adamw"] if r["name"] == "muon::AdamW fp32 state")
        rows.append((f"AdamW step, {data['adamw_parameters'] / 1e6:.1f}M parameters (`muon bench`)",
                     ms(ours["ms"]), f"torch::optim::AdamW (C++, not fused) {ms(torch_row['ms'])}",
                     ratio(ours["speedup"]), when(meta)))
    return rows


def summary():
    lines = ["| CPU, 2 cores | step | muon-cpp | peer | speed vs peer | run (date, commit) |",
             "|---|---|---|---|---|---|"]
    for cls in classes():
        for i, row in enumerate(summary_rows(cls)):
            lines.append("| " + " | ".join(((cls["name"],) if i == 0 else ("",)) + row) + " |")
    notes = []
    for cls in classes():
        loads = [f"{data['run']['load_average_at_start'][0]:.1f} ({name})"
                 for name, (data, _) in cls["runs"].items()
                 if "load_average_at_start" in data.get("run", {})]
        note = " ".join(filter(None, [cls.get("note"), loads and (
            "1-minute load average (2 cores) at each run's start: " + ", ".join(loads) + ".")]))
        if note:
            notes.append(f"{cls['name']}: {note}")
    return "\n".join(lines + [""] + ["\n\n".join(notes)])


def orth(data, rows, cols, method):
    for r in data["orthogonalization"]:
        if r["rows"] == rows and r["cols"] == cols and r["method"].startswith(method):
            return r
    return None


def cli_rows(data):
    """(figure, value) rows of one `muon bench --json` run."""
    step, load_ = data["muon_step"], data.get("load", {})
    adamw = {r["name"]: r for r in data["adamw"]}
    out = [("best fp32 GEMM, 2048³", f"{data['gemm_gflops']:.0f} GFLOP/s"),
           ("bf16 GEMM, 2048³", f"{data['bf16_gflops']:.0f} GFLOP/s" if data["bf16_gflops"]
            else "— (no bf16 dot products)")]
    for rows, cols in ((1024, 1024), (1024, 4096)):
        r = orth(data, rows, cols, "automatic")
        out.append((f"`orthogonalize` fp32, {rows}×{cols}, of the best fp32 GEMM",
                    f"{r['of_gemm']:.2f} ({r['method']})"))
    for rows, cols in ((1024, 1024), (1024, 4096)):
        r = orth(data, rows, cols, "bf16 automatic")
        out.append((f"`orthogonalize` bf16, {rows}×{cols}, of the bf16 GEMM",
                    f"{r['of_bf16_gemm']:.2f}" if r else "—"))
    out.append((f"Muon step fp32 ({step['matrices']} matrices), vs plain ATen",
                f"{ratio(step['speedup'])} ({ms(step['ours_ms'])} / {ms(step['plain_ms'])})"))
    out.append(("Muon step bf16, vs plain ATen (fp32)",
                f"{ratio(step['bf16_speedup'])} ({ms(step['bf16_ms'])})" if step["bf16_ms"]
                else "—"))
    for name in ("muon::AdamW fp32 state", "muon::AdamW bf16 state"):
        r = adamw[name]
        out.append((f"{name} ({data['adamw_parameters'] / 1e6:.1f}M), vs torch::optim::AdamW",
                    f"{ratio(r['speedup'])}, {r['of_bandwidth']:.2f} of the bandwidth"))
    for prefix, label in (("", "fp32"), ("bf16_", "bf16")):
        median, top = load_.get(f"{prefix}loaded_median_ms"), load_.get(f"{prefix}loaded_max_ms")
        out.append((f"Muon step beside a busy process, max / median ({label})",
                    f"{top / median:.2f}" if median else "—"))
    dist = data.get("distributed", {})
    out.append(("hybrid step on 2 ranks, per rank, vs 1 rank",
                f"{ratio(dist['speedup'])}" if dist.get("speedup") else "—"))
    return out


def cli():
    runs = [(cls, *cls["runs"]["muon-bench.json"]) for cls in classes()
            if "muon-bench.json" in cls["runs"]]
    head = "| `muon bench --json` | " + " | ".join(
        f"{cls['name']} ({when(meta)})" for cls, _, meta in runs) + " |"
    lines = [head, "|---" * (len(runs) + 1) + "|"]
    columns = [cli_rows(data) for _, data, _ in runs]
    for i, (figure, _) in enumerate(columns[0]):
        lines.append(f"| {figure} | " + " | ".join(col[i][1] for col in columns) + " |")
    return "\n".join(lines)


def state_rows(data, meta):
    """(set, state, bytes/param, peak, step, speed) rows of one bench/state_memory.py run."""
    rows = []
    for which, label in (("adamw", "AdamW"), ("muon", "Muon")):
        section = data.get(which, {})
        peer = next(iter(section), None)
        for name, row in section.items():
            if "error" in row and "state_bytes_per_param" not in row:
                rows.append((label, name, "—", "—", "—", f"not run: {row['error']}"))
                continue
            speed = row.get(f"speed_vs_{peer}")
            rows.append((label, name, f"{row['state_bytes_per_param']:.2f}",
                         f"{row['peak_MB']:.0f} MB (+{row['peak_growth_bytes_per_param']:.2f})",
                         step_figure(row) if row.get("step_ms") is not None else "—",
                         ratio(speed) if speed else "—"))
    return rows


def state():
    lines = ["| CPU, 2 cores | set | optimizer and state | state bytes / parameter | peak of a step "
             "(+ bytes / parameter over parameters and gradients) | step | speed vs the set's "
             "first row | run (date, commit) |", "|---|---|---|---|---|---|---|---|"]
    for cls in classes():
        if "state-memory.json" not in cls["runs"]:
            continue
        data, meta = cls["runs"]["state-memory.json"]
        for i, row in enumerate(state_rows(data, meta)):
            first = (cls["name"],) if i == 0 else ("",)
            lines.append("| " + " | ".join(first + row + ((when(meta),) if i == 0 else ("",)))
                         + " |")
    return "\n".join(lines)


def backward_rows(data):
    """(candidate, peak, step, speed vs fused AdamW, time vs the ordinary step) rows of one
    bench/step_in_backward.py run."""
    rows = []
    for name, row in data["candidates"].items():
        if "peak_bytes_per_param" not in row:
            rows.append((name, "—", "—", "—", f"not run: {row['error']}"))
            continue
        peak = f"{row['peak_MB']:.0f} MB ({row['peak_bytes_per_param']:.2f} B/param)"
        step = step_figure(row) if row.get("step_ms") is not None else "—"
        speed = ratio(row["speed_vs_fused_adamw"]) if row.get("speed_vs_fused_adamw") else "—"
        versus = ratio(row["time_vs_ordinary"]) if row.get("time_vs_ordinary") else "—"
        rows.append((name, peak, step, speed, versus))
    return rows


def backward():
    lines = ["| CPU, 2 cores | model | training step | peak of a step over the warmed-up process "
             "(bytes / parameter) | step | speed vs fused AdamW | time vs the ordinary step | run "
             "(date, commit) |", "|---|---|---|---|---|---|---|---|"]
    for cls in classes():
        runs = sorted((run for name, run in cls["runs"].items()
                       if name.startswith("step-in-backward")), key=lambda run: run[0]["layers"])
        for number, (data, meta) in enumerate(runs):
            model = (f"GPT {data['layers']} × {data['width']}, vocab {data['vocab']}, "
                     f"{data['parameters'] / 1e6:.1f}M parameters, batch {data['batch']} × "
                     f"{data['seq']}")
            for i, row in enumerate(backward_rows(data)):
                first = ((cls["name"] if number == 0 else "", model) if i == 0 else ("", ""))
                lines.append("| " + " | ".join(first + row + ((when(meta),) if i == 0 else ("",)))
                             + " |")
    return "\n".join(lines)


TABLES = {"summary": summary, "state": state, "backward": backward, "cli": cli}


def block(name):
    return re.compile(r"(<!-- figures: " + name + r"\b[^>]*-->\n)(.*?)(<!-- /figures: " + name
                      + r" -->)", re.S)


def expected(text, names):
    """`text` with every named table regenerated."""
    for name in names:
        pattern = block(name)
        if not pattern.search(text):
            raise ValueError(f"no <!-- figures: {name} --> block")
        table = TABLES[name]()
        text = pattern.sub(lambda m: m.group(1) + table + "\n" + m.group(3), text)
    return text


def stale():
    """The documents whose tables differ from what the JSON gives."""
    out = []
    for doc, names in DOCS.items():
        text = (ROOT / doc).read_text()
        if expected(text, names) != text:
            out.append(doc)
    return out


def main(argv):
    if "--write" in argv:
        for doc, names in DOCS.items():
            path = ROOT / doc
            path.write_text(expected(path.read_text(), names))
        print("figures: written")
    elif "--check" in argv:
        bad = stale()
        print("figures: " + ("stale in " + ", ".join(bad) if bad else "up to date"))
        return 1 if bad else 0
    else:
        for name, make in TABLES.items():
            print(f"{name}:\n{make()}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
