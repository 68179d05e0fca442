#!/usr/bin/env bash
# The GPU check: on a Linux machine with a CUDA build of PyTorch ≥ 2.4, nvcc, CMake and ninja —
# no network, no package manager — build the library and the Python module against that torch,
# run the optimizer tests on CUDA tensors, and print our Muon and AdamW steps against PyTorch's
# on a GPT-shaped set (bench/torch_peers.py). About 4–6 minutes on one GPU; docs/benchmarks.md
# holds the last figures.
#
#   scripts/gpu_check.sh [--quick]      # --quick: a small parameter set, few timed steps
#
# What the build needs beyond PyTorch: yaml-cpp (the system's, or the source tree that
# scripts/fetch_yaml_cpp.sh puts in .deps/yaml-cpp: run that where Debian's archive is reachable
# and bring .deps along) and pybind11 (pip's package or the system's). Optional, used when found:
# BLIS or a CBLAS (CPU Newton–Schulz products), nccl.h (NCCL for CUDA tensors in data-parallel
# runs; pip's CUDA wheels keep it in site-packages/nvidia). GoogleTest is not needed: the
# optimizer tests here are the Python suite, python/tests/test_devices.py on CUDA.
#
# Environment: PYTHON (default python3), MUON_GPU_CHECK_DEVICE (default cuda; cpu runs every step
# on CPU tensors, to try the script on a machine without a GPU), MUON_GPU_BUILD_DIR (build-gpu).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
python="${PYTHON:-python3}"
device="${MUON_GPU_CHECK_DEVICE:-cuda}"
build="${MUON_GPU_BUILD_DIR:-build-gpu}"
bench_args=()
[ "${1:-}" = "--quick" ] && bench_args=(--layers 2 --width 256 --vocab 4096 --steps 5)
started=$SECONDS
stage() { echo; echo "== gpu_check [$((SECONDS - started)) s]: $*"; }

stage "the machine"
"$python" - "$device" <<'PYTHON'
import sys
import torch
device = sys.argv[1]
major, minor = (int(x) for x in torch.__version__.split(".")[:2])
print(f"torch {torch.__version__} (CUDA {torch.version.cuda}), {torch.utils.cmake_prefix_path}")
if (major, minor) < (2, 4):
    sys.exit(f"gpu_check: needs PyTorch >= 2.4, this is {torch.__version__}")
if device == "cuda":
    if not torch.cuda.is_available():
        sys.exit("gpu_check: this PyTorch sees no CUDA device (MUON_GPU_CHECK_DEVICE=cpu tries "
                 "the script on CPU)")
    print("GPU:", torch.cuda.get_device_name(0))
PYTHON
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null || true

stage "configure"
cmake_args=(-S . -B "$build" -DCMAKE_BUILD_TYPE=Release -DMUON_BUILD_TESTS=OFF
  -DMUON_BUILD_BENCHMARKS=OFF -DMUON_BUILD_CLI=OFF -DMUON_BUILD_PYTHON=ON
  "-DPython_EXECUTABLE=$(command -v "$python")"
  "-DCMAKE_PREFIX_PATH=$("$python" -c 'import torch.utils; print(torch.utils.cmake_prefix_path)')")
command -v ninja >/dev/null && cmake_args+=(-G Ninja)
if pybind11_dir="$("$python" -m pybind11 --cmakedir 2>/dev/null)"; then
  cmake_args+=("-Dpybind11_DIR=$pybind11_dir")
fi
if [ -f .deps/yaml-cpp/CMakeLists.txt ]; then  # brought along: preferred, built with torch's ABI
  cmake_args+=("-DMUON_YAML_CPP_SOURCE=$(pwd)/.deps/yaml-cpp")
fi
site="$("$python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
nccl_header="$(find "$site/nvidia" -name nccl.h 2>/dev/null | head -1 || true)"
[ -n "$nccl_header" ] && cmake_args+=("-DMUON_NCCL_INCLUDE_DIR=$(dirname "$nccl_header")")
cmake "${cmake_args[@]}" | grep -E "^-- muon|Torch|CUDA" || true

stage "build (library and Python module)"
if ! cmake --build "$build" --target muon_python -j "$(nproc)" >"$build/build.log" 2>&1; then
  tail -40 "$build/build.log"
  if grep -q "distributed.cpp" "$build/build.log" && [ -n "$nccl_header" ]; then
    echo "gpu_check: the NCCL part of src/compose/distributed.cpp did not build (above);"
    echo "gpu_check: building without NCCL so that the tests and benchmarks still run"
    cmake "${cmake_args[@]}" -DMUON_USE_NCCL=OFF >/dev/null
    cmake --build "$build" --target muon_python -j "$(nproc)" >"$build/build.log" 2>&1 ||
      { tail -40 "$build/build.log"; exit 1; }
    echo "gpu_check: NCCL BUILD FAILED (everything else below is without NCCL)"
  else
    exit 1
  fi
fi

stage "optimizer tests on $device tensors (python/tests/test_devices.py), then the whole Python suite"
export PYTHONPATH="$(pwd)/$build/python${PYTHONPATH:+:$PYTHONPATH}"
(cd "$build/python" && MUON_TEST_DEVICE="$device" "$python" -m pytest -q -p no:cacheprovider \
  ../../python/tests/test_devices.py)
(cd "$build/python" && "$python" -m pytest -q -p no:cacheprovider -x ../../python/tests)

stage "benchmark: Muon and AdamW steps against PyTorch"
"$python" bench/torch_peers.py --device "$device" --layers 12 --mlp gelu --steps 20 \
  --json "$build/torch_peers.json" "${bench_args[@]}"
stage "done in $((SECONDS - started)) s"
