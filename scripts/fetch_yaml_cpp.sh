#!/usr/bin/env bash
# Brings yaml-cpp's source — Debian's source package, from Debian's archive — into .deps/yaml-cpp,
# for building muon-cpp where no yaml-cpp is installed and nothing can be downloaded (a GPU
# machine: scripts/gpu_check.sh builds it from there). Run it on a Debian machine that reaches
# Debian's archive; .deps/ is ignored by git and travels with the working tree.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
dest=.deps/yaml-cpp
if [ -f "$dest/CMakeLists.txt" ]; then
  echo "fetch_yaml_cpp: $dest is already there"
  exit 0
fi
mirror="${MUON_DEBIAN_MIRROR:-http://deb.debian.org/debian}"
suite="$(. /etc/os-release && echo "${VERSION_CODENAME:-bookworm}")"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
mkdir -p "$work/lists/partial" "$work/archives/partial"
echo "deb-src $mirror $suite main" >"$work/sources.list"
# A private apt configuration: only this source list, its own lists, nothing installed.
apt=(apt-get -q -o APT::Sandbox::User=root -o "Dir::Etc::SourceList=$work/sources.list"
  -o Dir::Etc::SourceParts=/dev/null
  -o "Dir::State::Lists=$work/lists" -o "Dir::Cache::Archives=$work/archives")
"${apt[@]}" update >/dev/null
(cd "$work" && "${apt[@]}" source --download-only yaml-cpp >/dev/null)
tarball="$(ls "$work"/yaml-cpp_*.orig.tar.*)"
mkdir -p "$dest"
tar -xf "$tarball" -C "$dest" --strip-components=1
echo "fetch_yaml_cpp: $(basename "$tarball") unpacked into $dest"
