#!/usr/bin/env bash
# Installs the Debian packages muon-cpp needs (only those missing), then configures and builds
# into build/ (override with MUON_BUILD_DIR): everything, or only the CMake targets named
# (`setup.sh muon_cli`, as train.sh does). Run by train.sh and test.sh.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

packages=(
  build-essential cmake ninja-build ccache  # toolchain; ccache keeps rebuilds fast
  libtorch-dev libopenblas-dev              # LibTorch 1.13 and the BLAS its GEMMs call
  libblis-openmp-dev                        # BLIS: the Newton–Schulz products (gemmt, syrk)
  libdnnl-dev                               # oneDNN: bf16 products (AVX512_BF16/AMX CPUs), bench
  libgloo-dev                               # headers of LibTorch's Gloo process group
  libcli11-dev                              # the muon command line
  libyaml-cpp-dev                           # YAML configuration
  libgtest-dev libbenchmark-dev             # tests and benchmarks
  bible-kjv                                 # the training text of `muon train`
  python3-torch python3-dev pybind11-dev    # the Python module muon_cpp (for /usr/bin/python3)
  python3-pytest python3-venv               # its tests, and `pip install .` in a virtual environment
  python3-hypothesis python3-yaml           # the property tests (docs/robustness.md)
  bc                                        # arithmetic in tests/distributed_faults.sh
  iproute2                                  # network namespaces: scripts/two_hosts.sh
)

# `setup.sh --packages-only PKG...`: install just those (when missing) and stop.
packages_only=""
if [ "${1:-}" = "--packages-only" ]; then
  shift
  packages=("$@")
  packages_only=1
fi

missing=()
for package in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$package" 2>/dev/null | grep -q "install ok installed" ||
    missing+=("$package")
done
if ((${#missing[@]})); then
  echo "setup: installing ${missing[*]}"
  sudo=""
  [ "$(id -u)" -eq 0 ] || sudo="sudo"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "${missing[@]}" >/dev/null
fi

[ -n "$packages_only" ] && exit 0
build_dir="${MUON_BUILD_DIR:-build}"
# The configuration follows what is built, so that `cmake --install` afterwards installs exactly
# that: the Python module only when it is built (everything, or a named muon_python). MUON_WERROR
# (test.sh sets it, so CI) makes a warning in muon-cpp's own code an error; otherwise the build
# directory keeps what it had.
python=OFF
{ [ $# -eq 0 ] || [[ " $* " == *" muon_python "* ]]; } && python=ON
options=(-DCMAKE_BUILD_TYPE=Release -DMUON_BUILD_PYTHON="$python")
[ -n "${MUON_WERROR:-}" ] && options+=(-DMUON_WERROR="$MUON_WERROR")
cmake -S . -B "$build_dir" -G Ninja "${options[@]}" >/dev/null
targets=()
for target in "$@"; do targets+=(--target "$target"); done
cmake --build "$build_dir" -j"$(nproc)" "${targets[@]}"
