"""Property-based tests of the `muon` command line: generated argument vectors for every
subcommand, run as real processes. The contract (docs/robustness.md): the command succeeds, or it
exits with status 2 (usage error, refused input), 1 (failure at run time) or 3 (failed collective)
and a message on stderr — never by a signal, never with a C++ backtrace — and a refused run
changes no file: a fresh --out stays absent, a run directory (resumed, or holding a run without
--overwrite) keeps every byte. Profiles and the outcome tally:
property_support.py.

    MUON_CLI=build/muon python3 -m pytest python/tests/cli_properties.py
"""
import hashlib
import os
import shutil
import subprocess
import tempfile

import pytest
from hypothesis import given, settings, strategies as st

from property_support import CRASH_MARKS, count

MUON = os.environ.get("MUON_CLI", "")
REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
DATA = os.path.join(REPO, "tests", "data", "genesis.txt")
WORK = tempfile.mkdtemp(prefix="muon_cli_properties_")
# Sizes stay small when valid (each example is a real run), and are refused before allocating when
# they are not: MUON_MEMORY_LIMIT makes "too large" mean a few GiB, whatever the machine.
ENVIRONMENT = dict(os.environ, MUON_MEMORY_LIMIT="4", OMP_NUM_THREADS="1")

pytestmark = pytest.mark.skipif(not MUON, reason="needs software: the muon CLI, named by MUON_CLI (unset)")

bad_numbers = st.sampled_from(["0", "-1", "2.5", "1e3", "9007199254740993", "99999999999999999999",
                               "abc", "", "nan", "inf", "-inf", "0x10", " 3", "1_000", "٣"])
huge = st.sampled_from(["100000", "1000000000", "4611686018427387904"])


def counts(low, high):
    return st.one_of(st.integers(low, high).map(str), bad_numbers)


def sizes(low, high):
    return st.one_of(st.integers(low, high).map(str), bad_numbers, huge)


rates = st.one_of(st.floats(1e-4, 0.1).map(repr), bad_numbers, st.sampled_from(["1e308", "1e-320"]))
words = st.text(st.characters(blacklist_characters="\0"), max_size=8)  # argv holds no NUL
texts = st.one_of(words, st.sampled_from(["kjv", DATA, "/nonexistent", "/", "-"]))

MODEL_FLAGS = {"--layers": sizes(1, 2), "--d-model": sizes(4, 32), "--heads": sizes(1, 4),
               "--kv-heads": sizes(1, 4), "--seq-len": sizes(2, 24)}
TRAIN_FLAGS = {**MODEL_FLAGS, "--steps": counts(1, 3), "--seed": counts(0, 5),
               "--batch-size": sizes(1, 4), "--log-every": counts(1, 3),
               "--eval-every": counts(1, 3), "--eval-batches": counts(1, 2),
               "--checkpoint-every": counts(0, 2), "--optimizer": st.sampled_from(
                   ["muon", "muonclip", "adamw", "sgd", ""]),
               "--state-dtype": st.sampled_from(["float32", "bfloat16", "float16"]),
               "--muon-lr": rates, "--adamw-lr": rates, "--threads": counts(0, 2),
               "--data": texts, "--nproc": st.sampled_from(["1", "0", "257", "x"]),
               "--dist-timeout": st.sampled_from(["1", "0", "-1", "nan", "1e9"]),
               "--config": st.sampled_from([os.path.join(REPO, "examples", n) for n in (
                   "muon.yaml", "dew.yaml", "adamw.yaml", "run.yaml")] + [
                   os.path.join(REPO, "tests", "data", "bad_config.yaml"), "/nonexistent", REPO])}
FLAGS = {
    "train": TRAIN_FLAGS,
    "route": {**MODEL_FLAGS, "--untied": None, "--config": TRAIN_FLAGS["--config"]},
    "schedule": {"--config": TRAIN_FLAGS["--config"], "--steps": counts(1, 500),
                 "--every": counts(0, 50), "--svg": st.sampled_from(["", "/", "OUT/s.svg"])},
    "compare": {**MODEL_FLAGS, "--steps": counts(1, 3), "--batch-size": sizes(1, 3),
                "--eval-every": counts(1, 2), "--log-every": counts(1, 2), "--seed": counts(0, 3),
                "--target": st.one_of(rates, st.sampled_from(["5", "0"])),
                "--optimizers": st.lists(st.sampled_from(
                    ["adamw", "muon", "dew", "speedtronic", "flaxchat", "sgd", "",
                     os.path.join(REPO, "examples", "muon.yaml"), "/nonexistent.yaml"]),
                    min_size=1, max_size=3).map(",".join),
                "--tune-lr": None, "--lr-grid": st.sampled_from(["1", "0.5", "0", "-1", "nan"]),
                "--data": texts},
    "bench": {"--only": st.sampled_from(["orthogonalize", "muon", "adamw", "foo", ""]),
              "--reps": st.sampled_from(["1", "0", "1001", "x"]),
              "--muon-layers": sizes(1, 1), "--muon-width": sizes(4, 16),
              "--adamw-layers": sizes(1, 1), "--adamw-width": sizes(4, 16),
              "--threads": counts(0, 2), "--json": st.sampled_from(["OUT/b.json", "/", ""])},
}
# Every example starts from a small valid invocation; the drawn flags replace its values.
BASE = {
    "train": {"--data": DATA, "--layers": "1", "--d-model": "16", "--seq-len": "16",
              "--batch-size": "2", "--steps": "2", "--eval-batches": "1"},
    "route": {"--layers": "1", "--d-model": "16"},
    "schedule": {"--config": os.path.join(REPO, "examples", "muon.yaml"), "--steps": "50"},
    "compare": {"--data": DATA, "--layers": "1", "--d-model": "16", "--seq-len": "16",
                "--batch-size": "2", "--steps": "2", "--optimizers": "adamw,muon"},
    "bench": {"--only": "muon", "--muon-layers": "1", "--muon-width": "8", "--reps": "1",
              "--one-environment": None},
}


@st.composite
def invocations(draw, command):
    """argv for `command`: the base invocation with up to four flags drawn from its table, and
    sometimes a mistyped or unknown flag, or a stray positional argument."""
    table = FLAGS[command]
    args = dict(BASE[command])
    for flag in draw(st.lists(st.sampled_from(sorted(table)), unique=True, max_size=4)):
        args[flag] = None if table[flag] is None else draw(table[flag], label=flag)
    extra = draw(st.sampled_from([[], [], [], ["--stpes", "3"], ["--bogus"], ["stray"], ["-h"],
                                  ["--steps"], ["--version"]]))
    argv = [command]
    for flag, value in args.items():
        argv += [flag] if value is None else [flag, value]
    return argv + extra


def digest(path):
    if not os.path.exists(path):
        return None
    if os.path.isfile(path):
        with open(path, "rb") as f:
            return hashlib.sha256(f.read()).hexdigest()
    return {name: digest(os.path.join(path, name)) for name in sorted(os.listdir(path))}


def run(prop, argv, out=None, cwd=None):
    """Runs `muon argv` (OUT in an argument: the example's own directory) and checks the
    contract; returns the exit status."""
    argv = [a.replace("OUT", out) if out else a for a in argv]
    # (The sample a run prints is bytes of a byte-level model: not always UTF-8.)
    result = subprocess.run([MUON, *argv], capture_output=True, text=True, env=ENVIRONMENT,
                            errors="backslashreplace",
                            cwd=cwd or WORK, timeout=300, check=False)
    output = result.stdout + result.stderr
    assert result.returncode >= 0, f"muon {argv} ended by signal {-result.returncode}:\n{output}"
    assert not any(mark in output for mark in CRASH_MARKS), f"muon {argv}:\n{output}"
    # 2: a usage error or refused input; 1: a failure at run time; 3: a failed collective.
    assert result.returncode in (0, 1, 2, 3), f"muon {argv} exited {result.returncode}:\n{output}"
    if result.returncode != 0:
        assert result.stderr.strip(), f"muon {argv} exited {result.returncode} without a message"
        count(prop, f"exit {result.returncode}")
    else:
        count(prop, "accepted")
    return result.returncode


def fresh_dir(name):
    path = os.path.join(WORK, name)
    shutil.rmtree(path, ignore_errors=True)
    return path


def small_run():
    """A finished two-step run to resume and to refuse overwriting (made once)."""
    path = os.path.join(WORK, "fixture_run")
    if not os.path.exists(os.path.join(path, "checkpoint.pt")):
        argv = ["train", *sum(([k, v] for k, v in BASE["train"].items()), []), "--out", path]
        subprocess.run([MUON, *argv], check=True, capture_output=True, env=ENVIRONMENT)
    return path


def cli_settings(share):
    """Hypothesis settings with `share` of the profile's examples: each example is a process."""
    return settings(max_examples=max(2, int(settings.default.max_examples * share)))


@cli_settings(0.2)
@given(argv=invocations("train"))
def test_cli_train(argv):
    """`muon train` (fresh runs): every run flag with small valid values, zero, negative,
    fractional, beyond 2^53, not numbers, huge sizes, unknown optimizers and dtypes, missing or
    malformed data and config files, mistyped flags."""
    out = fresh_dir("train_out")
    status = run("cli_train", [*argv, "--out", out])
    if status == 0 and "--print-config" not in argv and not {"-h", "--version"} & set(argv):
        assert os.path.exists(os.path.join(out, "checkpoint.pt")), "a finished run without its files"
    if status != 0:
        assert digest(out) in (None, {}), f"a refused run wrote {digest(out)}"


@cli_settings(0.2)
@given(argv=invocations("train"), overwrite=st.booleans())
def test_cli_train_into_a_run(argv, overwrite):
    """`muon train --out DIR` where DIR holds a finished run, with and without --overwrite, and
    `muon train --resume DIR` with the flags above (a flag that contradicts the run is refused)."""
    source = small_run()
    target = fresh_dir("existing_run")
    shutil.copytree(source, target)
    before = digest(target)
    resume = not overwrite and "--config" not in argv
    extra = ["--resume", target] if resume else ["--out", target, *(["--overwrite"] * overwrite)]
    status = run("cli_train_into_a_run", [*argv, *extra])
    if status != 0 or (not overwrite and not resume):
        assert digest(target) == before, "a refused run changed the run directory"


@cli_settings(0.4)
@given(argv=invocations("route"))
def test_cli_route(argv):
    """`muon route`: model sizes valid, zero, negative, huge; configs valid, malformed, missing."""
    run("cli_route", argv)


@cli_settings(0.4)
@given(argv=invocations("schedule"))
def test_cli_schedule(argv):
    """`muon schedule`: configs, lengths, intervals and SVG paths (a directory, unwritable)."""
    out = fresh_dir("schedule_out")
    os.makedirs(out)
    run("cli_schedule", argv, out)


@cli_settings(0.08)
@given(argv=invocations("compare"))
def test_cli_compare(argv):
    """`muon compare`: optimizer lists with unknown names and missing files, targets, learning-rate
    grids, and the model and loop flags as for train (run from the repository root)."""
    out = fresh_dir("compare_out")
    run("cli_compare", [*argv, "--out", out], cwd=REPO)


@cli_settings(0.06)
@given(argv=invocations("bench"))
def test_cli_bench(argv):
    """`muon bench`: sections, repetitions, sizes valid, zero, huge, and JSON paths."""
    out = fresh_dir("bench_out")
    os.makedirs(out)
    run("cli_bench", argv, out)


@cli_settings(0.4)
@given(argv=st.lists(st.one_of(st.sampled_from(
    ["train", "trian", "route", "compare", "schedule", "bench", "--version", "--help", "-h", "",
     "--", "-", "--steps", "1"]), words), max_size=3))
def test_cli_commands(argv):
    """`muon` itself: any one to three words — commands, mistyped commands, options, text."""
    if argv and argv[0] in ("train", "compare", "bench"):
        argv = [argv[0], "--help"]  # a real run is the tests above
    run("cli_commands", argv)


if __name__ == "__main__":
    raise SystemExit(pytest.main([__file__, "-q"]))
