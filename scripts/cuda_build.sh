#!/usr/bin/env bash
# The CUDA build: the library, the CLI, the Python module, the tests and the benchmarks configured
# against the CUDA LibTorch inside PyPI's torch (torch.utils.cmake_prefix_path of the venv that
# scripts/pypi_venv.sh makes) with this machine's nvcc, NCCL on, and compiled and linked. A
# machine without a GPU checks here that the CUDA build works; scripts/gpu_check.sh runs it where
# a GPU is. It is also CI's build without oneDNN (MUON_USE_DNNL=OFF: GPUs run bf16 on their own
# products): its CPU bf16 tests run, and must skip saying so, or assert the message about the
# build.
#
#   scripts/cuda_build.sh            # into build-cuda/ (override with MUON_CUDA_BUILD_DIR)
#
# Needs nvcc (on PATH, in /usr/local/cuda/bin, or CUDACXX) for LibTorch's CMake files. The venv
# is $MUON_PYPI_DIR/venv (default build-pypi/venv), made when missing.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
bash scripts/setup.sh --packages-only build-essential cmake ninja-build ccache libyaml-cpp-dev \
  libblis-openmp-dev libdnnl-dev libopenblas-dev libcli11-dev libgtest-dev libbenchmark-dev
# The toolkit's usual place, for shells that did not read /etc/profile.d (CI's).
command -v nvcc >/dev/null || [ -n "${CUDACXX:-}" ] || [ ! -x /usr/local/cuda/bin/nvcc ] ||
  export PATH="/usr/local/cuda/bin:$PATH"
command -v nvcc >/dev/null || [ -n "${CUDACXX:-}" ] ||
  { echo "cuda_build: needs the CUDA toolkit's nvcc on PATH (or CUDACXX)" >&2; exit 2; }
python="$(bash scripts/pypi_venv.sh "${MUON_PYPI_DIR:-build-pypi}/venv")"
# The wheel's CUDA libraries (cuBLAS, NCCL, cuDNN, ...) come as the pip packages nvidia-*: nccl.h
# is among them, and their lib/ directories are where libtorch_cuda.so's own dependencies are —
# newer than the toolkit's (NCCL above all), so executables are linked and run against them.
read -r torch_version torch_cuda prefix nccl pybind11_dir nvidia_libs < <("$python" -c '
import glob, os, torch, torch.utils, pybind11
nvidia = os.path.join(os.path.dirname(os.path.dirname(torch.__file__)), "nvidia")
nccl = [r for r, _, files in os.walk(nvidia) if "nccl.h" in files]
libs = sorted(d for d in glob.glob(os.path.join(nvidia, "*", "lib")) if os.path.isdir(d))
print(torch.__version__, torch.version.cuda, torch.utils.cmake_prefix_path,
      (nccl or ["-"])[0], pybind11.get_cmake_dir(), ":".join(libs) or "-")')
[ "$torch_cuda" != "None" ] || { echo "cuda_build: torch $torch_version is not a CUDA build" >&2; exit 1; }
build="${MUON_CUDA_BUILD_DIR:-build-cuda}"
echo "cuda_build: torch $torch_version (CUDA $torch_cuda), $(nvcc --version | tail -1)"
extra_args=()
[ "$nccl" != "-" ] && extra_args+=("-DMUON_NCCL_INCLUDE_DIR=$nccl")
[ "$nvidia_libs" != "-" ] &&
  extra_args+=("-DCMAKE_EXE_LINKER_FLAGS=-Wl,-rpath-link,$nvidia_libs -Wl,-rpath,$nvidia_libs")
mkdir -p "$build"
cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_PREFIX_PATH="$prefix" \
  -DPython_EXECUTABLE="$python" -Dpybind11_DIR="$pybind11_dir" -DMUON_USE_DNNL=OFF "${extra_args[@]}" \
  >"$build/configure.log" 2>&1 || { tail -40 "$build/configure.log" >&2; exit 1; }
grep -E '^-- muon:' "$build/configure.log"
grep -q 'muon: NCCL ON' "$build/configure.log" ||
  { echo "cuda_build: NCCL is not on (see $build/configure.log)" >&2; exit 1; }
cmake --build "$build" -j"$(nproc)"
# Without oneDNN, bf16 on CPU names the build (on a CPU with bf16 dot products) or the CPU.
OMP_NUM_THREADS=2 "$build/tests/muon_tests" \
  --gtest_filter='OrthogonalizeBf16.*:Orthogonalize.*Bf16:Orthogonalize.AutomaticPicks*'
echo "cuda_build: every target of $build compiled and linked against torch $torch_version (CUDA $torch_cuda)"
