"""What a bench/torch_peers.py run ran on, for its header and its JSON: the CPU's identity and
features, muon_cpp's build and products, the date, OpenBLAS's overrides and the load."""
import json
import os
import platform
import subprocess
import sys
import time

import muon_cpp


def cpuinfo():
    """The first CPU's /proc/cpuinfo fields, and its feature flags as a set."""
    with open("/proc/cpuinfo") as f:
        first = f.read().split("\n\n")[0].splitlines()
    info = {key.strip(): value.strip() for key, value in
            (line.split(":", 1) for line in first if ":" in line)}
    return info, set(info.get("flags", "").split())


def cpu_name():
    try:
        info, flags = cpuinfo()
        wanted = [f for f in ("avx2", "avx512f", "avx512_bf16", "amx_bf16") if f in flags]
        return f"{info['model name']}, cpu family {info['cpu family']}, {' '.join(wanted)}"
    except (OSError, KeyError, ValueError):
        return platform.processor() or "CPU"


def run_metadata():
    """What a reader of the JSON needs to place its figures: the CPU's identity and features,
    muon_cpp's build, the date, OpenBLAS's overrides, the instruction-set ceilings set and the
    load when the run began."""
    meta = {"date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "command": " ".join(sys.argv),
            "muon_cpp": getattr(muon_cpp, "__version__", None),
            "muon_cpp_products": {"fp32": muon_cpp._core.blas_backend(),
                                  "bf16": muon_cpp._core.bf16_products()},
            "openblas_env": {k: os.environ.get(k) for k in
                             ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE", "OPENBLAS_NUM_THREADS")},
            # The instruction-set ceilings that make this CPU run another class's kernels.
            "isa_env": {k: os.environ.get(k) for k in
                        ("ONEDNN_MAX_CPU_ISA", "ATEN_CPU_CAPABILITY", "MKL_ENABLE_INSTRUCTIONS")},
            "load_average_at_start": list(os.getloadavg())}
    try:
        meta["commit"] = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, timeout=10,
            cwd=os.path.dirname(os.path.abspath(__file__))).stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        meta["commit"] = None
    try:
        info, flags = cpuinfo()
        meta["cpu"] = {"model_name": info.get("model name"), "cpu_family": info.get("cpu family"),
                       "model": info.get("model"),
                       "flags": [f for f in ("avx2", "fma", "avx512f", "avx512_bf16", "amx_bf16",
                                             "amx_tile") if f in flags]}
    except OSError:
        meta["cpu"] = {"model_name": platform.processor() or None}
    return meta


def write_json(path, results):
    """results written to `path` (none: nothing), and a line that says so."""
    if path:
        with open(path, "w") as f:
            json.dump(results, f, indent=2)
        print(f"\nwrote {path}")
