"""Ctrl-C in `muon train`: a real SIGINT to a real process finishes the step, writes a checkpoint
and prints the resume command; `--resume` then logs exactly the rows an uninterrupted run logs
(every column but the timings, bit for bit, none lost or repeated). A flag that contradicts the run
is refused and changes no file; `--print-config` is the config the run stores; an existing run is
not overwritten without --overwrite; a second signal ends the process at once, leaving no torn
checkpoint. `muon compare` stopped the same way continues when the same command is run again.

    signal_resume.py MUON_BINARY DATA_FILE WORK_DIR
"""
import csv
import hashlib
import os
import shutil
import signal
import subprocess
import sys
import time

from torch_checkpoint import load_checkpoint

STEPS = 150
TIMED = {"tokens_per_s", "elapsed_s"}  # differ between any two runs


def command(muon, data, out, *extra):
    return [muon, "train", "--data", data, "--steps", str(STEPS), "--layers", "1",
            "--d-model", "48", "--seq-len", "32", "--batch-size", "8", "--log-every", "10",
            "--eval-every", "30", "--out", out, *extra]


def rows(out):
    with open(os.path.join(out, "metrics.csv"), newline="") as f:
        return [{k: v for k, v in row.items() if k not in TIMED} for row in csv.DictReader(f)]


def hashes(out):
    return {name: hashlib.sha256(open(os.path.join(out, name), "rb").read()).hexdigest()
            for name in sorted(os.listdir(out))}


def run(args, **kwargs):
    return subprocess.run(args, capture_output=True, text=True, **kwargs)


def interrupt(args, out, rows_before, signals=1, run_dir=None):
    """Starts `args` (writing into `out`), waits for `rows_before` metrics rows in `run_dir`
    (default: `out`), sends SIGINT `signals` times."""
    shutil.rmtree(out, ignore_errors=True)
    process = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    path = os.path.join(run_dir or out, "metrics.csv")
    deadline = time.time() + 300  # the runs before the one to cut may take a while
    while time.time() < deadline and process.poll() is None:
        if os.path.exists(path) and len(open(path).readlines()) > rows_before:
            break
        time.sleep(0.01)
    time.sleep(0.05)  # between two log rows
    for k in range(signals):
        if k > 0:
            time.sleep(0.1)  # a signal sent while the last is still pending merges with it
        process.send_signal(signal.SIGINT)
    output, _ = process.communicate(timeout=120)
    return process.returncode, output


def main():
    muon, data, work = sys.argv[1:4]
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    reference = os.path.join(work, "reference")
    subprocess.run(command(muon, data, reference), check=True, stdout=subprocess.DEVNULL)
    expected = rows(reference)
    assert [int(r["step"]) for r in expected] == list(range(0, STEPS + 1, 10)), expected

    # Ctrl-C mid-run, then --resume.
    cut = os.path.join(work, "cut")
    code, output = interrupt(command(muon, data, cut), cut, rows_before=4)
    assert code == 130, (code, output)
    assert f"resume with: {muon} train --resume {cut}" in output, output
    step = load_checkpoint(os.path.join(cut, "checkpoint.pt"))["step_count"]
    assert 0 < step < STEPS, step
    print(f"signal_resume: SIGINT stopped the run after step {step} with a checkpoint")
    resumed = run([muon, "train", "--resume", cut])
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    assert f"resumed from {cut}/checkpoint.pt at step {step}" in resumed.stdout, resumed.stdout
    assert rows(cut) == expected, (rows(cut), expected)
    print(f"signal_resume: the resumed run's {len(expected)} metrics rows equal the "
          "uninterrupted run's")

    # A contradicting flag changes nothing; a safe one is allowed (checked with --print-config).
    before = hashes(cut)
    refused = run([muon, "train", "--resume", cut, "--steps", str(STEPS + 50), "--d-model", "64"])
    assert refused.returncode == 2, refused.stdout + refused.stderr
    assert (f"the run in {cut} is not the one this command describes — model.d_model: 48 in the "
            "run, 64 from --d-model" in refused.stderr), refused.stderr
    assert hashes(cut) == before
    config = open(os.path.join(cut, "config.yaml")).read()
    printed = run([muon, "train", "--resume", cut, "--print-config"])
    assert printed.returncode == 0 and printed.stdout == config, printed.stdout + printed.stderr
    fresh = run(command(muon, data, os.path.join(work, "unused"), "--print-config"))
    assert fresh.stdout == open(os.path.join(reference, "config.yaml")).read(), fresh.stdout
    saved = load_checkpoint(os.path.join(cut, "checkpoint.pt"))["config"]
    assert saved.startswith(config), (saved, config)
    longer = run([muon, "train", "--resume", cut, "--steps", str(STEPS + 50), "--print-config"])
    assert f"steps: {STEPS + 50}" in longer.stdout, longer.stdout
    assert f"warning: --steps {STEPS + 50} changes the run's length from {STEPS}" in longer.stderr
    print("signal_resume: a contradicting flag is refused and no file changes; --print-config "
          "is the stored config")

    # An existing run is not overwritten.
    again = run(command(muon, data, cut))
    assert again.returncode == 2 and "holds a run already" in again.stderr, again.stderr
    assert hashes(cut) == before

    # Two signals: out at once, no torn checkpoint.
    twice = os.path.join(work, "twice")
    code, output = interrupt(command(muon, data, twice, "--checkpoint-every", "1"), twice,
                             rows_before=2, signals=2)
    assert code == 130, (code, output)
    path = os.path.join(twice, "checkpoint.pt")
    note = (f"second interrupt: stopped at once, without a new checkpoint. If {path} exists, "
            f"{muon} train --resume {twice} continues from it; if not, start the run again with "
            "--overwrite.")
    # The second signal came while the first was being handled (the note), or after the process
    # had checkpointed and printed how to resume (then the note may follow): never in silence.
    assert note in output or f"resume with: {muon} train --resume {twice}" in output, output
    if os.path.exists(path):
        load_checkpoint(path)  # whole
        printed = run([muon, "train", "--resume", twice, "--print-config"])
        assert printed.returncode == 0, printed.stderr
    print("signal_resume: a second signal ends the process at once; the checkpoint is whole")

    # Two signals inside one long step, before the first checkpoint: the note says what to do,
    # and so do the start command and --resume when they meet the directory.
    early = os.path.join(work, "early")
    slow = [muon, "train", "--data", data, "--steps", "50", "--layers", "2", "--d-model", "256",
            "--seq-len", "128", "--batch-size", "32", "--log-every", "1", "--eval-every", "50",
            "--out", early]
    code, output = interrupt(slow, early, rows_before=1, signals=2)
    assert code == 130, (code, output)
    assert (f"second interrupt: stopped at once, without a new checkpoint. If {early}/checkpoint.pt "
            f"exists, {muon} train --resume {early} continues from it; if not, start the run "
            "again with --overwrite." in output), output
    assert not os.path.exists(os.path.join(early, "checkpoint.pt"))
    again = run(slow)
    assert again.returncode != 0 and (
        f"'{early}' holds a run that stopped before its first checkpoint, so it cannot be "
        "continued; pass --overwrite to start it again there" in again.stderr), again.stderr
    resumed = run([muon, "train", "--resume", early])
    assert resumed.returncode != 0 and (
        f"'{early}' holds a run that stopped before its first checkpoint (no checkpoint.pt), so "
        f"it cannot be continued; start it again with --overwrite --out {early}"
        in resumed.stderr), resumed.stderr
    print("signal_resume: two signals before the first checkpoint say what to do, and so does "
          "the directory they leave")
    # A directory where the checkpoint should be: a clear error, not an abort.
    odd = os.path.join(work, "odd")
    os.makedirs(os.path.join(odd, "checkpoint.pt"))
    refused = run([muon, "train", "--resume", odd])
    assert refused.returncode == 2, (refused.returncode, refused.stderr)
    assert f"cannot read '{odd}/checkpoint.pt': it is not a regular file" in refused.stderr
    compare_again(muon, data, work)
    print("signal_resume: OK")


def compare_again(muon, data, work):
    """Ctrl-C in `muon compare` during its second run, then the same command: the first run is
    kept as it was, the second continues, and the report equals an uninterrupted compare's."""
    examples = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "examples")
    steps = 60  # two runs of 60 steps, cut in the second

    def compare(out):
        args = command(muon, data, out)[2:]
        args[args.index("--steps") + 1] = str(steps)
        return [muon, "compare", "--optimizers",
                ",".join(os.path.join(examples, name + ".yaml") for name in ("adamw", "muon")),
                *args]

    reference = os.path.join(work, "compare_reference")
    whole = run(compare(reference))
    assert whole.returncode == 0, whole.stdout + whole.stderr
    cut = os.path.join(work, "compare_cut")
    code, output = interrupt(compare(cut), cut, rows_before=3, run_dir=os.path.join(cut, "muon"))
    assert code == 130, (code, output)
    assert "compare: interrupted; the same command continues it" in output, output
    step = load_checkpoint(os.path.join(cut, "muon", "checkpoint.pt"))["step_count"]
    assert 0 < step < steps, step
    first = hashes(os.path.join(cut, "adamw"))
    again = run(compare(cut))
    assert again.returncode == 0, again.stdout + again.stderr
    assert f"kept the finished run in {cut}/adamw" in again.stdout, again.stdout
    assert f"continuing the run in {cut}/muon from step {step}" in again.stdout, again.stdout
    assert hashes(os.path.join(cut, "adamw")) == first
    for name in ("adamw", "muon"):
        assert rows(os.path.join(cut, name)) == rows(os.path.join(reference, name)), name
    report = open(os.path.join(reference, "compare.csv")).read()
    assert open(os.path.join(cut, "compare.csv")).read() == report
    table = whole.stdout[whole.stdout.index("| optimizer |"):]
    assert again.stdout.endswith(table.replace(reference, cut)), (again.stdout, table)
    print(f"signal_resume: compare stopped in its second run at step {step}; the same command "
          "kept the first and finished the second as an uninterrupted compare")


if __name__ == "__main__":
    main()
