#!/bin/bash
# Packs what tests/gpu/run-on-device.sh needs on a machine that cannot build
# flextp (no Debian packages, no network): the GPU test and benchmark
# programs from a CUDA build, the shared libraries they need that a CUDA
# image lacks (OpenBLAS and its Fortran runtime; the CUDA libraries -- cudart,
# cuBLAS, NCCL -- are found there instead), the stories260K test data and
# the arch-refs F32 models with llama.cpp's references.
#
# usage: tests/gpu/pack-for-device.sh [BUILD_DIR] [OUT_DIR]
#   BUILD_DIR  a build configured with -Dcuda=enabled (default: build)
#   OUT_DIR    default: .device (add it to .git/info/exclude; carry it)
# Then, on the device machine, in the repository root:
#   tests/gpu/run-on-device.sh OUT_DIR
set -eu
build=${1:-build}
out=${2:-.device}
root=$(cd "$(dirname "$0")/../.." && pwd)
data=${FTP_TEST_DATA:-$root/../shared/data}
bins="test-gpu test-kernels test-cuda-engine gpu-bench"
ninja -C "$build" $(for b in $bins; do printf 'tests/gpu/%s ' "$b"; done)
stage=$(mktemp -d); trap 'rm -rf "$stage"' EXIT
mkdir -p "$stage/bin" "$stage/lib" "$stage/data/models"
for b in $bins; do cp "$build/tests/gpu/$b" "$stage/bin/"; done
# Libraries outside glibc, libstdc++/libgcc and CUDA's own.
for b in $bins; do ldd "$build/tests/gpu/$b"; done | awk '$3 ~ /^\// {print $1, $3}' | sort -u |
  while read -r name path; do
    case $name in
      libc.so*|libm.so*|libdl.so*|librt.so*|libpthread.so*|ld-linux*|libstdc++*|libgcc_s*) ;;
      libcudart*|libcublas*|libcublasLt*|libnccl*|libcuda.so*) ;;
      *) cp -L "$path" "$stage/lib/$name" ;;
    esac
  done
if [ -d "$data/models/stories260K" ]; then
  cp -r "$data/models/stories260K" "$stage/data/models/"
else
  echo "pack-for-device: $data/models/stories260K not found: the goldens will be skipped there" >&2
fi
# The arch-refs F32 models and llama.cpp's references (test-cuda-engine).
refs="$data/models/arch-refs"
if [ -f "$refs/references.jsonl" ]; then
  mkdir -p "$stage/data/models/arch-refs"
  for f in references.jsonl llama-f32.gguf llama3-ropefreqs-f32.gguf qwen2-f32.gguf qwen3-f32.gguf; do
    cp "$refs/$f" "$stage/data/models/arch-refs/"
  done
else
  echo "pack-for-device: $refs/references.jsonl not found: the arch-refs checks will be skipped there" >&2
fi
mkdir -p "$out"
tar -C "$stage" -czf "$out/ftp-gpu.tar.gz" .
cp "$root/tests/gpu/run-on-device.sh" "$out/"
grep -qx "/$out/" "$root/.git/info/exclude" 2>/dev/null || grep -qx "/$out/" "$(git -C "$root" rev-parse --git-path info/exclude)" 2>/dev/null ||
  echo "pack-for-device: add '/$out/' to $(git -C "$root" rev-parse --git-path info/exclude) so that git ignores it" >&2
echo "packed $(du -h "$out/ftp-gpu.tar.gz" | cut -f1) into $out/ftp-gpu.tar.gz ($bins, $(ls "$stage/lib" | tr '\n' ' '))"
