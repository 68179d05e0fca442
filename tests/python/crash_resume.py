"""Crash safety of `muon train`: kill -9 it at random points — some while it writes a checkpoint —
resume from whatever checkpoint is left, and check that every run ends bit for bit where an
uninterrupted run ends.

    crash_resume.py MUON_BINARY DATA_FILE WORK_DIR [KILLS]
"""
import os
import random
import shutil
import signal
import subprocess
import sys
import time

import torch

from torch_checkpoint import load_checkpoint

STEPS = 60


def command(muon, data, out, resume=False):
    args = [muon, "train", "--data", data, "--steps", str(STEPS), "--layers", "1",
            "--d-model", "32", "--seq-len", "32", "--batch-size", "4", "--log-every", "10",
            "--eval-every", "30", "--checkpoint-every", "1", "--out", out]
    return args + (["--resume", out] if resume else [])


def checkpoint_step(out):
    path = os.path.join(out, "checkpoint.pt")
    if not os.path.exists(path):
        return None
    return load_checkpoint(path)["step_count"]  # a torn file would fail to load here


def kill_at_random_time(process, rng, duration):
    time.sleep(rng.uniform(0.05, 0.9) * duration)
    process.send_signal(signal.SIGKILL)
    return "at a random time"


def kill_while_writing(process, out, delay):
    # The checkpoint is written to checkpoint.pt.tmp.<pid>, then renamed: some way into the run,
    # kill while that file exists. False when the run ended first.
    time.sleep(delay)
    while process.poll() is None:
        if os.path.isdir(out) and any(".tmp." in name for name in os.listdir(out)):
            process.send_signal(signal.SIGKILL)
            return True
    return False


def same_checkpoints(a, b):
    x, y = load_checkpoint(a), load_checkpoint(b)
    assert x["step_count"] == y["step_count"] == STEPS, (x["step_count"], y["step_count"])
    for name, tensor in y["model"].items():
        assert torch.equal(x["model"][name], tensor), name
    for name, entry in y["state"].items():
        for key, value in entry.items():
            if isinstance(value, torch.Tensor):
                assert torch.equal(x["state"][name][key], value), (name, key)
            else:
                assert x["state"][name][key] == value, (name, key)


def main():
    muon, data, work = sys.argv[1:4]
    kills = int(sys.argv[4]) if len(sys.argv) > 4 else 6
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    reference = os.path.join(work, "reference")
    start = time.time()
    subprocess.run(command(muon, data, reference), check=True, stdout=subprocess.DEVNULL)
    duration = time.time() - start
    rng = random.Random(20261130)
    for run in range(kills):
        out = os.path.join(work, f"run{run}")
        if run % 2 == 0:  # mid-write, after a random part of the run (sooner if it ends first)
            how = "while writing a checkpoint"
            delay = rng.uniform(0.3, 0.8) * duration
            while True:
                shutil.rmtree(out, ignore_errors=True)
                process = subprocess.Popen(command(muon, data, out), stdout=subprocess.DEVNULL,
                                           stderr=subprocess.DEVNULL)
                if kill_while_writing(process, out, delay):
                    break
                delay /= 2
        else:
            process = subprocess.Popen(command(muon, data, out), stdout=subprocess.DEVNULL,
                                       stderr=subprocess.DEVNULL)
            how = kill_at_random_time(process, rng, duration)
        process.wait()
        step = checkpoint_step(out)  # whole (torch.load succeeds) or absent
        if process.returncode == 0:
            print(f"run {run}: finished before the kill")
        elif step is None:
            print(f"run {run}: killed {how} before the first checkpoint; starting over")
            subprocess.run(command(muon, data, out) + ["--overwrite"], check=True,
                           stdout=subprocess.DEVNULL)
        elif step < STEPS:
            print(f"run {run}: killed {how}; resuming from step {step}")
            subprocess.run(command(muon, data, out, resume=True), check=True,
                           stdout=subprocess.DEVNULL)
        else:
            print(f"run {run}: killed {how} after the last checkpoint")
        same_checkpoints(os.path.join(out, "checkpoint.pt"),
                         os.path.join(reference, "checkpoint.pt"))
        print(f"run {run}: same final weights and optimizer state as the uninterrupted run")


if __name__ == "__main__":
    main()
