"""How bench/torch_peers.py times its candidates: in alternating rounds, each within a time budget
of its own; torch.mm's fp32 and bf16 rates in a short probe that names why a bf16 candidate ran
out of it; and the share of muon_cpp's steps spent reading param_groups.

A candidate's budget covers all its timed calls, warm-up ones included, and each candidate gets
one timed call at least. The first warm-up call is always made (until then a step's length is
unknown); another only where it leaves room for a timed one. A warm-up call that leaves no room
is kept as the timed one: at a step that long, a first call's setup is a small part. A candidate
whose next call would pass its budget takes no more rounds while the others go on; its median is
over the rounds it took.
"""
import statistics
import time

import torch

PROBE_SIZE = 512


def timed(step, device):
    """Milliseconds one call of step() takes (CUDA events on a GPU)."""
    if device.type == "cuda":
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        step()
        end.record()
        torch.cuda.synchronize(device)
        return start.elapsed_time(end)
    begin = time.perf_counter()
    step()
    return (time.perf_counter() - begin) * 1e3


def error_line(e):
    return f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"


def attempt(name, work, failed):
    """work()'s result; or None, with its error line printed and kept in failed[name], so that one
    candidate that raises leaves the others running."""
    try:
        return work()
    except Exception as e:  # any failure of a candidate is its own, reported, not the run's
        failed[name] = error_line(e)
        print(f"  {name}: error: {failed[name]}")
        return None


def mm_rates(device, size=PROBE_SIZE, seconds=0.2):
    """torch.mm's GFLOP/s on a size² product in fp32 and bf16: one untimed call (setup), then
    calls for about `seconds`, at least one, so the probe stays short where bf16 is 100× slow."""
    rates = {}
    for dtype in (torch.float32, torch.bfloat16):
        a = torch.randn(size, size).to(device, dtype)
        timed(lambda: torch.mm(a, a), device)
        total_ms, calls = 0.0, 0
        while total_ms < seconds * 1e3:
            total_ms += timed(lambda: torch.mm(a, a), device)
            calls += 1
        rates[str(dtype)[6:]] = 2 * size ** 3 * calls / total_ms / 1e6
    return rates


def slow_bf16(rates):
    """Why a bf16 candidate ran out of its budget, where torch's bf16 products are the cause."""
    if rates["bfloat16"] >= rates["float32"]:
        return None
    return (f"bf16 products at {gflops(rates['bfloat16'])} on this CPU "
            f"(torch.mm {PROBE_SIZE}²; fp32 {gflops(rates['float32'])})")


def gflops(rate):
    return f"{rate:.0f} GFLOP/s" if rate >= 10 else f"{rate:.2g} GFLOP/s"


class Candidate:
    """One candidate's calls: their milliseconds, the seconds they took all told, how it ended."""

    def __init__(self, step, budget_s):
        self.step, self.budget_s = step, budget_s
        self.samples, self.seconds, self.last_s = [], 0.0, 0.0
        self.warmup, self.error = 0, None
        self.stopped, self.note = False, None

    def call(self, device):
        """One call's milliseconds, or None after it raised (then the candidate is done)."""
        try:
            ms = timed(self.step, device)
        except Exception as e:  # reported in the candidate's line; the others go on
            self.error = error_line(e)
            return None
        self.seconds += ms / 1e3
        self.last_s = ms / 1e3
        return ms

    def fits(self, calls):
        """Whether `calls` more calls as long as the last one stay within the budget."""
        return self.seconds + calls * self.last_s <= self.budget_s

    def warm_up(self, device, warmup):
        for i in range(warmup):
            # The first call is always made: until then the step's length is unknown.
            if i > 0 and not self.fits(2):
                return
            ms = self.call(device)
            if ms is None:
                return
            if not self.fits(1):
                self.samples.append(ms)
                return
            self.warmup += 1

    def take_round(self, device):
        if self.error is None and (not self.samples or self.fits(1)):
            ms = self.call(device)
            if ms is not None:
                self.samples.append(ms)

    @property
    def ms(self):
        return statistics.median(self.samples) if self.samples else None

    def stop_note(self, rounds, warmup, why):
        """None for a candidate that ran as asked; else what the budget (or an error) cut."""
        if self.error is not None:
            return f"error: {self.error}"
        cuts = []
        self.stopped = len(self.samples) < rounds
        if self.stopped:
            cuts.append(f"stopped: {why + ', ' if why else ''}its {self.budget_s:g} s budget used")
        if self.warmup < warmup:
            cuts.append("no warm-up: its first step is the timed one" if self.warmup == 0
                        else f"warm-up cut to {self.warmup} of {warmup} steps")
        if not cuts:
            return None
        n = len(self.samples)
        spent = f"{self.seconds:.3g} s" + (" with its warm-up" if self.warmup else "")
        return f"{n} step{'' if n == 1 else 's'}, {spent}; " + "; ".join(cuts)


def median_times(steps_by_name, device, args, bf16=()):
    """Each round calls every candidate still within its budget once (args.steps rounds after
    args.warmup warm-up calls each, args.budget seconds per candidate); the Candidate of each,
    with its median milliseconds and, in `notes`, a line for each one the budget or an error cut.
    bf16 names the candidates whose products are torch's bf16 ones, for the reason they stop."""
    budget = args.budget if args.budget > 0 else float("inf")
    runs = {name: Candidate(step, budget) for name, step in steps_by_name.items()}
    for run in runs.values():
        run.warm_up(device, args.warmup)
    for _ in range(args.steps):
        for run in runs.values():
            run.take_round(device)
    why = slow_bf16(args.mm_rates)
    for name, run in runs.items():
        run.note = run.stop_note(args.steps, args.warmup, why if name in bf16 else None)
    return runs


def record(name, run, row):
    """The candidate's timing in its JSON row, and its stop line printed under its figures."""
    row.update(timed_steps=len(run.samples), warmup_steps=run.warmup, seconds=run.seconds)
    if run.error is not None:
        row["error"] = run.error
    elif run.stopped:
        row["stopped"] = run.note
    if run.note:
        print(f"    {name}: {run.note}")


def param_groups_reading(optimizer, repeats=2000):
    """The Python work muon_cpp's step() does around its engine, in microseconds per step:
    param_groups read for changed tensors (one identity check each) and for changed settings,
    which are checked and pushed into the engine only then (here, as in a run without a
    scheduler, they stay the same), and what the step's end reads back. None for torch's own
    optimizers."""
    if not hasattr(optimizer, "_begin_step"):
        return None
    begin = time.perf_counter()
    for _ in range(repeats):
        optimizer._begin_step()
        optimizer._end_step()
    return (time.perf_counter() - begin) / repeats * 1e6


def print_reading(optimizer, step_ms, row):
    reading = param_groups_reading(optimizer)
    if reading is not None:
        row["param_groups_reading_us"] = reading
        print(f"  {'':24s} of which reading param_groups: {reading:.1f} µs "
              f"({reading / (step_ms * 1e3) * 100:.3f}% of the step)")
