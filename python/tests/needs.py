"""Skips that are skips. A test that cannot run here for want of hardware or of an optional
dependency calls one of these, which skip it with what it needs ("needs hardware: ..." or "needs
software: ...", the forms tests/needs.h uses); conftest.py fails any other skip, and
scripts/skips.py counts them for each stage of the test scripts."""
import sys
from pathlib import Path

import pytest
import torch

import muon_cpp

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))
from skips import cpu_flags_promise_bf16_products  # noqa: E402 (the one reading of the bits)


def hardware(what):
    pytest.skip(f"needs hardware: {what}")


def software(what):
    pytest.skip(f"needs software: {what}")


def bf16_products():
    """bf16 products on CPU (not their emulation): nothing where muon_cpp runs them; a skip where
    the CPU's feature bits lack them (or ONEDNN_MAX_CPU_ISA takes them away) or the build has no
    oneDNN; a failure where the bits promise them and a build with oneDNN still runs none."""
    described = muon_cpp._core.bf16_products()
    if not described.startswith("emulated: "):
        return
    reason = described[len("emulated: "):]
    if not cpu_flags_promise_bf16_products() or "ONEDNN_MAX_CPU_ISA=" in reason:
        hardware(f"bf16 dot products (AVX512_BF16 or AMX); {reason}")
    if "this build has no oneDNN" in reason:
        software(f"oneDNN (libdnnl-dev); {reason}")
    pytest.fail("the CPU's feature bits (/proc/cpuinfo) have bf16 dot products, yet muon_cpp "
                f"runs none: {reason}")


def torch_at_least(major, minor, what):
    """A feature of later torch releases; asserts that a torch as new as that has it."""
    if tuple(int(part) for part in torch.__version__.split(".")[:2]) < (major, minor):
        software(f"torch >= {major}.{minor} ({what}); this is {torch.__version__}")
