#!/bin/bash
# Packs what tests/gpu/run-on-device.sh, tests/gpu/issue17-on-device.sh and issue19-on-device.sh
# need on a machine that cannot build flextp (no Debian packages, no
# network): the GPU test and benchmark programs from a CUDA build, the
# daemon and its shift tool (ftp-serve, ftp-shift) with the streaming load
# of tests/gpu/shift-under-load.sh (shift-load), every shared library they
# need that a CUDA image lacks (derived from ldd by tests/gpu/pack-libs.sh,
# and checked to resolve inside the pack: OpenBLAS, libuv, ICU, libcurl,
# OpenSSL, gloo, ...; not glibc, libstdc++ or the CUDA and driver libraries
# -- cudart, cuBLAS, NCCL, NVML -- which are found there instead), the
# stories260K test data and the arch-refs F32 models with llama.cpp's
# references (FTP_PACK_ARCH_REFS=0 leaves them out: 26 MB of the pack).
#
# The pack is OUT_DIR/ftp-gpu.tar.xz (xz: a third smaller than gzip, which
# matters under the device tool's 64 MiB carry limit; device-env.sh unpacks
# it with tar, or with python3 where there is no xz). Over 64 MiB it is
# refused (exit 1) with its size.
#
# usage: tests/gpu/pack-for-device.sh [BUILD_DIR] [OUT_DIR]
#   BUILD_DIR  a build configured with -Dcuda=enabled (default: build)
#   OUT_DIR    default: .device (add it to .git/info/exclude; carry it)
# Then, on the device machine, in the repository root:
#   tests/gpu/issue17-on-device.sh OUT_DIR   (or tests/gpu/run-on-device.sh OUT_DIR)
set -eu
build=${1:-build}
out=${2:-.device}
root=$(cd "$(dirname "$0")/../.." && pwd)
data=${FTP_TEST_DATA:-$root/../shared/data}
# Paths in the build; the pack holds them all in bin/.
progs="tests/gpu/test-gpu tests/gpu/test-kernels tests/gpu/test-cuda-engine tests/gpu/gpu-bench tests/gpu/shift-load
       tools/ftp-serve tools/ftp-shift"
ninja -C "$build" $progs
stage=$(mktemp -d); trap 'rm -rf "$stage"' EXIT
mkdir -p "$stage/bin" "$stage/lib" "$stage/data/models"
paths=
for p in $progs; do cp "$build/$p" "$stage/bin/"; paths="$paths $build/$p"; done
here=$root/tests/gpu
# shellcheck disable=SC2086
"$here/pack-libs.sh" copy "$stage/lib" $paths
# shellcheck disable=SC2086
"$here/pack-libs.sh" check "$stage/lib" $paths || { echo "pack-for-device: a library would come from outside the pack (above)" >&2; exit 1; }
if [ -d "$data/models/stories260K" ]; then
  cp -r "$data/models/stories260K" "$stage/data/models/"
else
  echo "pack-for-device: $data/models/stories260K not found: the goldens will be skipped there" >&2
fi
# The arch-refs F32 models and llama.cpp's references (test-cuda-engine).
refs="$data/models/arch-refs"
if [ "${FTP_PACK_ARCH_REFS:-1}" = 0 ]; then
  echo "pack-for-device: FTP_PACK_ARCH_REFS=0: the arch-refs checks will be skipped there" >&2
elif [ -f "$refs/references.jsonl" ]; then
  mkdir -p "$stage/data/models/arch-refs"
  for f in references.jsonl llama-f32.gguf llama3-ropefreqs-f32.gguf qwen2-f32.gguf qwen3-f32.gguf; do
    cp "$refs/$f" "$stage/data/models/arch-refs/"
  done
else
  echo "pack-for-device: $refs/references.jsonl not found: the arch-refs checks will be skipped there" >&2
fi
mkdir -p "$out"
rm -f "$out/ftp-gpu.tar.gz" "$out/ftp-gpu.tar.xz"
tar -C "$stage" -cf - . | xz -T2 -6 >"$out/ftp-gpu.tar.xz"
cp "$root/tests/gpu/run-on-device.sh" "$root/tests/gpu/device-env.sh" "$out/"
grep -qx "/$out/" "$root/.git/info/exclude" 2>/dev/null || grep -qx "/$out/" "$(git -C "$root" rev-parse --git-path info/exclude)" 2>/dev/null ||
  echo "pack-for-device: add '/$out/' to $(git -C "$root" rev-parse --git-path info/exclude) so that git ignores it" >&2
bytes=$(stat -c %s "$out/ftp-gpu.tar.xz")
if [ "$bytes" -gt $((64 * 1024 * 1024)) ]; then
  echo "pack-for-device: $out/ftp-gpu.tar.xz is $bytes bytes, over the device tool's 64 MiB carry limit" \
       "(a build with -Dgpu_archs=90 only? FTP_PACK_ARCH_REFS=0 saves 26 MB)" >&2
  exit 1
fi
echo "packed $(du -h "$out/ftp-gpu.tar.xz" | cut -f1) into $out/ftp-gpu.tar.xz ($(ls "$stage/bin" | tr '\n' ' ')); $(ls "$stage/lib" | wc -l) libraries: $(ls "$stage/lib" | tr '\n' ' ')"
