#!/usr/bin/env bash
# The README's main command, then `cmake --install` of the build directory it leaves: a user who
# trained with scripts/train.sh (which builds the library and the CLI only) installs exactly what
# was built — the CLI, the library, its headers and CMake package, no Python module — and the
# installed `muon` runs. Run by .ci/run on a clean clone, before the test command reuses build/.
# Extra arguments go to train.sh (default: a 20-step run, enough to write a checkpoint).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
build_dir="${MUON_BUILD_DIR:-build}"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT

fail() { echo "install after train.sh: $*" >&2; exit 1; }

bash scripts/train.sh --steps 20 --out "$work/run" "$@"
[ -f "$work/run/metrics.csv" ] || fail "train.sh left no metrics.csv in $work/run"

cmake --install "$build_dir" --prefix "$work/prefix" >/dev/null ||
  fail "cmake --install $build_dir failed after train.sh"
for file in bin/muon include/muon/muon.h; do
  [ -e "$work/prefix/$file" ] || fail "$file is not installed"
done
ls "$work"/prefix/lib*/cmake/muon/muonConfig.cmake >/dev/null 2>&1 ||
  fail "the CMake package (lib*/cmake/muon/muonConfig.cmake) is not installed"
ls "$work"/prefix/lib*/libmuon.* >/dev/null 2>&1 || fail "the library is not installed"
if find "$work/prefix" -name '_core*.so' | grep -q .; then
  fail "a Python module was installed although train.sh did not build one"
fi
version="$("$work/prefix/bin/muon" --version)" || fail "the installed muon does not run"
echo "install after train.sh: OK ($version)"
