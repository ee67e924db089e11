#!/bin/bash
# The shared libraries of a device pack (tests/gpu/pack-for-device.sh),
# derived from ldd: every library the programs need except those a CUDA
# image has (glibc, libstdc++/libgcc, the CUDA toolkit's and the driver's).
#
#   pack-libs.sh copy LIBDIR PROGRAM...   copy them into LIBDIR
#   pack-libs.sh check LIBDIR PROGRAM...  with LD_LIBRARY_PATH=LIBDIR alone,
#       every library each program needs must resolve inside LIBDIR or be
#       one of the allowed system names (is_system below); prints each one
#       that would come from elsewhere or is not found, and exits 1 if any.
#   pack-libs.sh selftest PROGRAM...      the meson test (suite gpu): copy
#       into a temporary LIBDIR, then check passes there, and fails on an
#       empty LIBDIR (the check can fail), with one line each.
set -u

# Library names (sonames, as ldd prints them) the device machine provides.
is_system() {
  case $1 in
    linux-vdso.so*|ld-linux*|libc.so*|libm.so*|libdl.so*|librt.so*|libpthread.so*|libresolv.so*|libutil.so*) return 0 ;;
    libstdc++.so*|libgcc_s.so*) return 0 ;;
    libcudart.so*|libcublas.so*|libcublasLt.so*|libnccl.so*|libcuda.so*|libnvidia-ml.so*) return 0 ;;
  esac
  return 1
}

# ldd's "NAME => PATH" and "NAME => not found" lines of PROGRAM, as "NAME PATH".
needs() {
  ldd "$1" | awk '$2 == "=>" && $3 ~ /^\// {print $1, $3} $2 == "=>" && $3 == "not" {print $1, "not-found"}'
}

if [ "${1:-}" = selftest ]; then
  shift
  tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
  "$0" copy "$tmp/lib" "$@" || { echo "FAIL: copy"; exit 1; }
  n=$(ls "$tmp/lib" | wc -l)
  if "$0" check "$tmp/lib" "$@"; then echo "ok: $n libraries copied; every other library each program needs is a system one"
  else echo "FAIL: a library resolves outside the copied $n (above)"; exit 1; fi
  mkdir "$tmp/empty"
  if "$0" check "$tmp/empty" "$@" 2>/dev/null; then echo "FAIL: check passes with an empty LIBDIR"; exit 1
  else echo "ok: check fails with an empty LIBDIR"; fi
  exit 0
fi
cmd=${1:-}; libdir=${2:-}
[ $# -ge 3 ] || { echo "usage: pack-libs.sh copy|check LIBDIR PROGRAM... | selftest PROGRAM..." >&2; exit 2; }
shift 2
case $cmd in
  copy)
    mkdir -p "$libdir"
    for p in "$@"; do needs "$p"; done | sort -u | while read -r name path; do
      is_system "$name" && continue
      if [ "$path" = not-found ]; then echo "pack-libs: $name (needed by one of $*) is not found here" >&2; exit 1; fi
      cp -L "$path" "$libdir/$name"
    done ;;
  check)
    bad=0
    dir=$(cd "$libdir" && pwd)
    for p in "$@"; do
      while read -r name path; do
        is_system "$name" && continue
        case $path in "$dir"/*) continue ;; esac
        echo "pack-libs: $(basename "$p") needs $name, which resolves to $path, not to the pack's $dir" >&2
        bad=1
      done < <(LD_LIBRARY_PATH=$dir needs "$p")
    done
    exit $bad ;;
  *) echo "pack-libs: unknown command '$cmd' (copy or check)" >&2; exit 2 ;;
esac
