#!/usr/bin/env bash
# The GPU check: one prepared run on one GPU (about 5–8 minutes), on a Linux machine with a CUDA
# build of PyTorch ≥ 2.6, nvcc, CMake and ninja — no network, no package manager. It builds the
# library and the Python module against that torch's CUDA LibTorch with NCCL, then runs on the GPU:
#   - the device tests (python/tests/test_devices.py: every update's ATen form against the fused
#     CPU kernels and torch.optim);
#   - the paths GPUs run (python/tests/test_gpu_paths.py): the fp32 and bf16 Newton–Schulz chains
#     against float64, the stochastic-rounding hash against the CPU's bits, and an NCCL process
#     group of one — the C++ Communicator over torch's group and over the one it makes from
#     torchrun's variables, muon_cpp.Muon with that group, beside DDP and on FSDP2;
#   - bench/torch_peers.py --device cuda: our Muon and AdamW steps beside torch.optim.Muon and
#     torch.optim.AdamW(fused=True), written to one JSON (default build-gpu/gpu_check.json).
# Any fallback fails it: no GPU, NCCL not built, a skipped test (scripts/skips.py --none).
#
#   scripts/gpu_check.sh [--dry-run | --rehearse] [--quick]
#     --dry-run   list each step, run nothing (CI runs this)
#     --rehearse  every step on the CPU, to try the script where no GPU is: the NCCL test skips
#                 (for want of hardware, the only skip allowed then) and the figures are the CPU's
#     --quick     a small benchmark (2 layers of width 256, 5 timed steps)
#
# What the build needs beyond PyTorch: yaml-cpp (the system's, or the source tree that
# scripts/fetch_yaml_cpp.sh puts in .deps/yaml-cpp: run that where Debian's archive is reachable
# and bring .deps along) and pybind11 (pip's package or the system's); nccl.h comes with pip's
# CUDA wheels (site-packages/nvidia). Optional: BLIS or a CBLAS (CPU Newton–Schulz products).
# Environment: PYTHON (default python3), MUON_GPU_BUILD_DIR (default build-gpu), MUON_GPU_JSON.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
dry_run="" quick="" device=cuda skips=--none
for arg in "$@"; do
  case "$arg" in
    --dry-run) dry_run=1 ;;
    --rehearse) device=cpu skips=--hardware-only ;;
    --quick) quick=1 ;;
    *) echo "gpu_check: unknown argument '$arg' (valid: --dry-run, --rehearse, --quick)" >&2
       exit 2 ;;
  esac
done
python="${PYTHON:-python3}"
build="${MUON_GPU_BUILD_DIR:-build-gpu}"
json="${MUON_GPU_JSON:-$build/gpu_check.json}"
bench_args=(--layers 12 --mlp gelu --steps 20)
[ -n "$quick" ] && bench_args=(--layers 2 --width 256 --vocab 4096 --steps 5)
started=$SECONDS
count=0

# step NAME COMMAND...: runs COMMAND (a shell function or program), or lists it under --dry-run.
step() {
  local name="$1"
  shift
  count=$((count + 1))
  if [ -n "$dry_run" ]; then
    echo "step $count: $name: $*"
    return
  fi
  echo
  echo "== gpu_check step $count [$((SECONDS - started)) s]: $name"
  "$@"
}

the_machine() {
  "$python" - "$device" <<'PYTHON'
import sys
import torch
device = sys.argv[1]
major, minor = (int(x) for x in torch.__version__.split(".")[:2])
print(f"torch {torch.__version__} (CUDA {torch.version.cuda}), {torch.utils.cmake_prefix_path}")
if (major, minor) < (2, 6):
    sys.exit(f"gpu_check: needs PyTorch >= 2.6 (FSDP2), this is {torch.__version__}")
if torch.version.cuda is None:
    sys.exit(f"gpu_check: this PyTorch ({torch.__version__}) is not a CUDA build")
if device == "cuda":
    if not torch.cuda.is_available():
        sys.exit("gpu_check: this PyTorch sees no CUDA device (--rehearse tries the script on "
                 "the CPU)")
    import torch.distributed as dist
    if not dist.is_nccl_available():
        sys.exit("gpu_check: this PyTorch has no NCCL")
    print("GPU:", torch.cuda.get_device_name(0))
else:
    print("rehearsal: every step on the CPU")
PYTHON
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null || true
}

configure() {
  local args=(-S . -B "$build" -DCMAKE_BUILD_TYPE=Release -DMUON_BUILD_TESTS=OFF
    -DMUON_BUILD_BENCHMARKS=OFF -DMUON_BUILD_CLI=OFF -DMUON_BUILD_PYTHON=ON
    "-DPython_EXECUTABLE=$(command -v "$python")"
    "-DCMAKE_PREFIX_PATH=$("$python" -c 'import torch.utils; print(torch.utils.cmake_prefix_path)')")
  command -v ninja >/dev/null && args+=(-G Ninja)
  local pybind11_dir site nccl_header
  if pybind11_dir="$("$python" -m pybind11 --cmakedir 2>/dev/null)"; then
    args+=("-Dpybind11_DIR=$pybind11_dir")
  fi
  if [ -f .deps/yaml-cpp/CMakeLists.txt ]; then  # brought along: built with torch's ABI
    args+=("-DMUON_YAML_CPP_SOURCE=$(pwd)/.deps/yaml-cpp")
  fi
  site="$("$python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
  nccl_header="$(find "$site/nvidia" -name nccl.h 2>/dev/null | head -1 || true)"
  [ -n "$nccl_header" ] || { echo "gpu_check: no nccl.h under $site/nvidia" >&2; return 1; }
  args+=("-DMUON_NCCL_INCLUDE_DIR=$(dirname "$nccl_header")")
  mkdir -p "$build"
  cmake "${args[@]}" >"$build/configure.log" 2>&1 || { tail -40 "$build/configure.log"; return 1; }
  grep -E "^-- muon" "$build/configure.log" || true
  grep -q "muon: NCCL ON" "$build/configure.log" ||
    { echo "gpu_check: NCCL is not on (see $build/configure.log)" >&2; return 1; }
}

build_module() {
  cmake --build "$build" --target muon_python -j "$(nproc)" >"$build/build.log" 2>&1 ||
    { tail -40 "$build/build.log"; return 1; }
}

# The tests on the GPU; a skip (a path that did not run) fails the step.
gpu_tests() {
  local repo="$PWD" module junit status=0
  module="$(cd "$build/python" && pwd)"
  junit="$module/gpu_tests.xml"
  (cd "$module" && PYTHONPATH="$module" MUON_TEST_DEVICE="$device" "$python" -m pytest -q -rs \
    -p no:cacheprovider --junitxml="$junit" "$repo/python/tests/test_devices.py" \
    "$repo/python/tests/test_gpu_paths.py") || status=$?
  python3 scripts/skips.py "$junit" --stage "gpu_check ($device)" "$skips" || status=1
  return "$status"
}

benchmark() {
  PYTHONPATH="$(cd "$build/python" && pwd)" "$python" bench/torch_peers.py --device "$device" \
    "${bench_args[@]}" --json "$json"
}

step "the machine: PyTorch >= 2.6 with CUDA and NCCL, one GPU" the_machine
step "configure against its CUDA LibTorch, NCCL on (no fallback)" configure
step "build the library and the Python module" build_module
step "device tests and the GPU paths on $device (no skips)" gpu_tests
step "benchmark beside torch.optim.Muon and AdamW(fused=True) -> $json" benchmark
if [ -n "$dry_run" ]; then
  echo "gpu_check --dry-run: $count steps listed; nothing was run"
else
  echo
  echo "== gpu_check: done in $((SECONDS - started)) s; figures in $json"
fi
