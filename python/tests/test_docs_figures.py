"""The speed figures of README.md and docs/benchmarks.md are the recorded runs' (docs/bench/):
their tables are regenerated from the JSON by docs/bench/figures.py and compared, and README.md
carries no speed ratio outside them. Plain json and re: needs neither torch nor the extension.

After a new benchmark run: `python3 docs/bench/figures.py --write` (docs/benchmarks.md, Method).
"""
import importlib.util
import json
import pathlib
import re

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]


def load_figures():
    spec = importlib.util.spec_from_file_location("figures", ROOT / "docs" / "bench" / "figures.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


figures = load_figures()


@pytest.mark.parametrize("doc", sorted(figures.DOCS))
def test_tables_match_the_recorded_runs(doc):
    text = (ROOT / doc).read_text()
    assert figures.expected(text, figures.DOCS[doc]) == text, (
        f"{doc}: a speed table differs from docs/bench/*.json; "
        "run python3 docs/bench/figures.py --write (or fix the JSON)")


def test_a_changed_figure_is_caught():
    text = (ROOT / "README.md").read_text()
    table = figures.block("summary").search(text).group(2)
    first = re.search(r"\d+\.\d\d×", table)
    assert first, "the README's summary table has no ratio"
    wrong = f"{float(first.group()[:-1]) + 0.01:.2f}×"
    edited = text.replace(table, table.replace(first.group(), wrong, 1))
    assert figures.expected(edited, ["summary"]) != edited


def test_readme_has_no_ratio_outside_the_tables():
    text = (ROOT / "README.md").read_text()
    outside = text
    for name in figures.DOCS["README.md"]:
        outside = figures.block(name).sub("", outside)
    stray = re.findall(r".{0,40}\d(?:\.\d+)?×.{0,40}", outside)
    assert not stray, f"README.md: speed ratios outside the generated table: {stray}"


def test_every_run_names_its_cpu_date_and_commit():
    for cls in figures.classes():
        assert cls["cpu"] and cls["name"]
        for name, (data, meta) in cls["runs"].items():
            assert re.match(r"\d{4}-\d\d-\d\d", meta.get("date", "")), (cls["id"], name)
            assert re.fullmatch(r"[0-9a-f]{7,40}", meta.get("commit", "")), (cls["id"], name)
            assert data.get("threads") == 2, (cls["id"], name)


def test_each_muon_and_adamw_figure_names_the_strongest_peer():
    rows = [row for cls in figures.classes() if any(n.startswith("torch-peers") for n in cls["runs"])
            for row in figures.summary_rows(cls)]
    assert rows
    for step, _, peer, _, _ in rows:
        expected_peer = figures.PEER_MUON if step.startswith("Muon") else figures.PEER_ADAMW
        assert peer.startswith(expected_peer), (step, peer)


def test_the_manifest_lists_every_recorded_file():
    listed = {f"{cls['id']}/{name}" for cls in figures.classes() for name in cls["runs"]}
    present = {str(p.relative_to(figures.BENCH)) for p in figures.BENCH.glob("*/*.json")}
    assert listed == present
    for path in present:
        json.loads((figures.BENCH / path).read_text())


def test_a_stopped_candidate_is_marked_and_one_that_raised_is_left_out():
    """bench/torch_peers.py's time budget stops a slow candidate (its median is over the steps it
    made) and records a candidate that raised by its error alone."""
    peer = {"step_ms": 53000.0, "timed_steps": 1, "seconds": 53.0,
            "stopped": "1 step, 53 s; stopped: bf16 products at 0.98 GFLOP/s on this CPU"}
    data = {"layers": 1, "width": 256, "mlp": "swiglu", "adamw": {}, "muon": {
        figures.PEER_MUON: peer,
        "muon_cpp.Muon bfloat16": {"error": "ValueError: bfloat16 on CPU runs on bf16 dot"},
        "muon_cpp.Muon float32": {"step_ms": 2000.0, "timed_steps": 10,
                                  f"speed_vs_{figures.PEER_MUON}": 26.5}}}
    cls = {"runs": {"torch-peers.json": (data, {"date": "2026-12-08", "commit": "abc1234"})}}
    rows = figures.summary_rows(cls)
    assert [row[0].split(",")[1].strip() for row in rows] == ["fp32 Newton–Schulz"]
    assert rows[0][1] == "2000 ms"
    assert rows[0][2] == f"{figures.PEER_MUON} (bf16) 53000 ms (1 step, stopped)"
    assert rows[0][3] == "26.50×"
