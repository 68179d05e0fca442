"""What the property tests (test_properties.py, cli_properties.py) share: their Hypothesis
profiles, the contract every refusal must meet, and a tally of outcomes per property.

Profiles (MUON_PROPERTY_PROFILE): ``ci`` (the default) draws a fixed sequence of examples
(derandomized), MUON_PROPERTY_EXAMPLES per property (default 100; the commands that start
processes take a share of it), so CTest runs are reproducible and bounded; ``long`` draws fresh examples (seed: pytest's --hypothesis-seed) and many more —
scripts/property_run.sh runs it for a given time. With MUON_PROPERTY_REPORT=FILE, the outcomes
of every example (accepted, or the exception type that refused it) are added to FILE (JSON), from
which scripts/robustness_tables.py writes the table of docs/robustness.md.
"""
import atexit
import collections
import json
import os

from hypothesis import HealthCheck, settings

_relaxed = dict(deadline=None, database=None, print_blob=True,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much,
                                       HealthCheck.data_too_large])
settings.register_profile(
    "ci", max_examples=int(os.environ.get("MUON_PROPERTY_EXAMPLES", "100")), derandomize=True,
    **_relaxed)
settings.register_profile(
    "long", max_examples=int(os.environ.get("MUON_PROPERTY_EXAMPLES", "300")), **_relaxed)
settings.load_profile(os.environ.get("MUON_PROPERTY_PROFILE", "ci"))

_tally = collections.defaultdict(collections.Counter)

# Text that means an error escaped as a crash or a raw C++ report instead of a message.
CRASH_MARKS = ("Exception raised from", "frame #", "terminate called", "Segmentation fault",
               "Aborted", "core dumped", "what():", "Traceback")


def accepted(prop):
    _tally[prop]["accepted"] += 1


def refused(prop, error, allowed, names=()):
    """Checks a refusal against the contract — one of the `allowed` exception types, a message
    that is not empty, carries no C++ backtrace and (when `names` are given) names one of them —
    and counts it under its type."""
    assert isinstance(error, allowed), f"{type(error).__name__} is not one of {allowed}: {error}"
    text = str(error)
    assert text.strip(), f"{type(error).__name__} with an empty message"
    assert not any(mark in text for mark in CRASH_MARKS), f"a raw C++ report: {text}"
    if names:
        assert any(name in text for name in names), f"{text!r} names none of {sorted(names)}"
    _tally[prop][type(error).__name__] += 1


def count(prop, outcome):
    _tally[prop][outcome] += 1


@atexit.register
def _write_report():
    path = os.environ.get("MUON_PROPERTY_REPORT")
    if not path or not _tally:
        return
    report = {}
    if os.path.exists(path):
        with open(path, encoding="utf-8") as f:
            report = json.load(f)
    for prop, counts in _tally.items():
        merged = collections.Counter(report.get(prop, {}))
        merged.update(counts)
        report[prop] = dict(merged)
    with open(path, "w", encoding="utf-8") as f:
        json.dump(report, f, indent=1, sort_keys=True)
        f.write("\n")
