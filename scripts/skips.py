#!/usr/bin/env python3
"""What a test run skipped, and whether it may: reads the JUnit file of one run — CTest's
(`ctest --output-junit`) or pytest's (`--junitxml`) — and prints the count of skipped tests with
what each needed. Every skip must say what it needs ("needs hardware: ..." or "needs software:
...": tests/needs.h, python/tests/needs.py). Exit status 1 where one does not; where the CPU's
feature bits (/proc/cpuinfo) have bf16 dot products (AVX512_BF16 or AMX) and a test was skipped for
want of bf16 products (unless ONEDNN_MAX_CPU_ISA took them away: a run that models another CPU
class); with --hardware-only, where a test was skipped for want of software (a stage
that installed everything); with --none, on any skip (scripts/gpu_check.sh: every path must run).

    scripts/skips.py JUNIT_XML [--stage NAME] [--hardware-only | --none]
"""
import argparse
import re
import sys
import xml.etree.ElementTree as ElementTree
from collections import Counter
from pathlib import Path

NEEDS = re.compile(r"needs (hardware|software): .*")
# pytest's short summary (-rs) inside a CTest entry's output: "SKIPPED [2] file.py:12: reason".
PYTEST_SKIPPED = re.compile(r"^SKIPPED \[(\d+)\] [^ ]+: (.*)$", re.MULTILINE)
# The markers CTest writes for an entry that did not run: its reason is in its output.
CTEST_MARKERS = ("SKIP_RETURN_CODE", "SKIP_REGULAR_EXPRESSION_MATCHED")


def cpu_flags():
    """The CPU's feature bits as the kernel reports them (/proc/cpuinfo), read independently of
    muon-cpp's own detection; empty off Linux."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


def cpu_flags_promise_bf16_products():
    """AVX512_BF16 or AMX: the bf16 dot products muon-cpp's CPU bf16 path runs on."""
    return bool({"avx512_bf16", "amx_bf16"} & cpu_flags())


def skips(junit):
    """(reason, count) for every skip of the run; a reason not saying what it needs stays as
    written (or names the test)."""
    found = Counter()
    for case in ElementTree.parse(junit).iter("testcase"):
        output = case.findtext("system-out") or ""
        skipped = case.find("skipped")
        if skipped is not None:
            message = skipped.get("message", "")
            if message.startswith(CTEST_MARKERS):
                needs = NEEDS.search(output)
                message = needs.group(0) if needs else f"{case.get('name')}: {message}"
            found[message.strip()] += 1
        for count, reason in PYTEST_SKIPPED.findall(output):
            found[reason.strip()] += int(count)
    return found


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("junit")
    parser.add_argument("--stage", default="")
    parser.add_argument("--hardware-only", action="store_true")
    parser.add_argument("--none", action="store_true")
    args = parser.parse_args()
    found = skips(args.junit)
    stage = f"{args.stage}: " if args.stage else ""
    print(f"{stage}{sum(found.values())} skipped")
    bf16_cpu = cpu_flags_promise_bf16_products()
    wrong = []
    for reason, count in sorted(found.items()):
        print(f"  {count} × {reason}")
        kind = NEEDS.match(reason)
        if not kind:
            wrong.append(f"a skip that does not say what it needs: {reason}")
        elif (bf16_cpu and ("bf16 dot products" in reason or "oneDNN" in reason)
              and "ONEDNN_MAX_CPU_ISA=" not in reason):  # a test run that models another CPU
            wrong.append(f"this CPU has bf16 dot products (/proc/cpuinfo), yet: {reason}")
        elif args.none:
            wrong.append(f"every test must run in this stage, yet: {reason}")
        elif args.hardware_only and kind.group(1) == "software":
            wrong.append(f"everything was installed for this stage, yet: {reason}")
    for line in wrong:
        print(f"skips: {line}", file=sys.stderr)
    return 1 if wrong else 0


if __name__ == "__main__":
    sys.exit(main())
