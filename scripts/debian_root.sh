#!/usr/bin/env bash
# The compatibility builds: the whole project built and tested against another Debian release —
# sid (LibTorch/PyTorch 2.14, g++ 16, Python 3.14, C++20) or trixie (LibTorch 2.6, g++ 14) —
# inside a root file system of that release made with debootstrap from Debian's own archive.
# Needs root (debootstrap, chroot and bind mounts) and Debian's archive; nothing else is
# downloaded.
#
#   scripts/debian_root.sh RELEASE                 # make the root if missing, then build + test
#   scripts/debian_root.sh RELEASE --root-only     # only make (or check) the root
#   scripts/debian_root.sh RELEASE -- CMD ARGS...  # run CMD in the repository inside the root
#
# The root is cached in $MUON_DEBIAN_ROOTS/RELEASE (default /var/cache/muon-cpp/RELEASE), so later
# runs on the same machine skip debootstrap; it is made again when missing or incomplete. The
# build goes to build-RELEASE/ in the repository, its ccache to .ccache/ inside the root.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
repo="$(pwd)"
release="${1:-}"
case "$release" in
  sid | trixie) shift ;;
  *) echo "usage: scripts/debian_root.sh sid|trixie [--root-only | -- CMD ARGS...]" >&2; exit 2 ;;
esac
root="${MUON_DEBIAN_ROOTS:-/var/cache/muon-cpp}/$release"
mirror="${MUON_DEBIAN_MIRROR:-http://deb.debian.org/debian}"
[ "$(id -u)" -eq 0 ] || { echo "debian_root: needs root (debootstrap, chroot, mount)" >&2; exit 2; }

make_root() {
  # A root file system is complete when debootstrap finished: it writes this marker last.
  [ -f "$root/.muon-debootstrap-done" ] && return 0
  command -v debootstrap >/dev/null || {
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq debootstrap >/dev/null
  }
  echo "debian_root: debootstrap $release into $root (once per machine)"
  rm -rf "$root"
  mkdir -p "$root"
  debootstrap --variant=minbase --include=ca-certificates "$release" "$root" "$mirror" \
    >"$root.log" 2>&1 || { tail -20 "$root.log" >&2; exit 1; }
  # sid's Release file is signed for a week at a time and the archive's copy may be older: the
  # signature is still checked, only its date is not.
  echo 'Acquire::Check-Valid-Until "false";' >"$root/etc/apt/apt.conf.d/99muon-valid-until"
  touch "$root/.muon-debootstrap-done"
}

# Mounts what a build and its tests need inside the root; undone on exit.
mounts=()
unmount_all() {
  for ((i = ${#mounts[@]} - 1; i >= 0; i--)); do umount -l "${mounts[$i]}" 2>/dev/null || true; done
}
trap unmount_all EXIT
bind() {  # bind SOURCE TARGET-INSIDE-ROOT
  mkdir -p "$root$2"
  mount --bind "$1" "$root$2"
  mounts+=("$root$2")
}

run_inside() {
  bind /proc /proc
  bind /dev /dev
  bind /dev/pts /dev/pts
  bind /dev/shm /dev/shm
  bind /sys /sys
  bind "$repo" /src
  mkdir -p "$root/.ccache"
  cp -L /etc/resolv.conf "$root/etc/resolv.conf" 2>/dev/null || true
  chroot "$root" /usr/bin/env -i HOME=/root PATH=/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin \
    LANG=C.UTF-8 TERM="${TERM:-dumb}" CCACHE_DIR=/.ccache MUON_BUILD_DIR="build-$release" \
    ${OPENBLAS_CORETYPE:+OPENBLAS_CORETYPE=$OPENBLAS_CORETYPE} \
    ${OPENBLAS_L2_SIZE:+OPENBLAS_L2_SIZE=$OPENBLAS_L2_SIZE} \
    bash -c 'cd /src && "$@"' bash "$@"
}

make_root
case "${1:-}" in
  --root-only) exit 0 ;;
  --) shift; run_inside "$@" ;;
  *) run_inside bash scripts/test.sh ;;
esac
