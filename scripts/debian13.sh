#!/usr/bin/env bash
# The compatibility build: the whole project built and tested against Debian 13 (trixie) —
# LibTorch 2.6, BLIS 1.0, g++ 14, CMake 3.31 — inside a Debian 13 root file system made with
# debootstrap from Debian's own archive. Needs root (debootstrap, chroot and bind mounts) and
# Debian's archive; nothing else is downloaded.
#
#   scripts/debian13.sh                 # make the root file system if missing, then build + test
#   scripts/debian13.sh --root-only     # only make (or check) the root file system
#   scripts/debian13.sh -- CMD ARGS...  # run CMD in the repository inside the root file system
#
# The root file system is cached in $MUON_DEBIAN13_ROOT (default /var/cache/muon-cpp/debian13),
# so later runs on the same machine skip debootstrap; it is made again when missing or
# incomplete. The build goes to build-debian13/ in the repository (its ccache in
# .ccache-debian13/ of the cache, beside the root file system).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
repo="$(pwd)"
root="${MUON_DEBIAN13_ROOT:-/var/cache/muon-cpp/debian13}"
mirror="${MUON_DEBIAN_MIRROR:-http://deb.debian.org/debian}"
[ "$(id -u)" -eq 0 ] || { echo "debian13: needs root (debootstrap, chroot, mount)" >&2; exit 2; }

make_root() {
  # A root file system is complete when debootstrap finished: it writes this marker last.
  [ -f "$root/.muon-debootstrap-done" ] && return 0
  command -v debootstrap >/dev/null || {
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq debootstrap >/dev/null
  }
  echo "debian13: debootstrap trixie into $root (once per machine)"
  rm -rf "$root"
  mkdir -p "$root"
  debootstrap --variant=minbase --include=ca-certificates trixie "$root" "$mirror" >"$root.log" 2>&1 ||
    { tail -20 "$root.log" >&2; exit 1; }
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
    LANG=C.UTF-8 TERM="${TERM:-dumb}" CCACHE_DIR=/.ccache MUON_BUILD_DIR=build-debian13 \
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
