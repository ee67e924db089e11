#!/bin/bash
# Builds the libFuzzer targets for the model parsers (fuzz_gguf, fuzz_llama2c,
# fuzz_quant: the block decoders, fuzz_safetensors)
# with clang++ -fsanitize=fuzzer,address,undefined, compiling the lib/model
# sources directly, and runs each for a short time on a seed corpus made from
# the real test files (copied to a temp folder, never into the repository).
#
#   tests/fuzz/run-fuzz.sh SOURCE_ROOT [WORK_DIR] [SECONDS]
#
# SECONDS per target (default 15; env FUZZ_SECONDS overrides). Exit 0 when no
# crash was found, 1 on a crash (the reproducer is kept under
# WORK_DIR/fuzz-artifacts/), 77 (skip) when clang++ or libFuzzer is missing
# (Debian: apt-get install clang libclang-rt-14-dev).
#
# Longer runs: give more seconds and keep a corpus between runs, e.g.
#   FUZZ_SECONDS=3600 FUZZ_JOBS=8 FUZZ_CORPUS=$HOME/ftp-fuzz-corpus \
#     tests/fuzz/run-fuzz.sh . build
# FUZZ_CORPUS keeps what each target learns (one sub-folder per target) so a
# later run starts where the last one stopped; FUZZ_JOBS runs that many
# fuzzing processes per target. To replay a crash:
#   build/fuzz/fuzz_gguf build/fuzz-artifacts/crash-<sha1>
set -u
src=$(cd "${1:?usage: run-fuzz.sh SOURCE_ROOT [WORK_DIR] [SECONDS]}" && pwd)
work=${2:-$(mktemp -d)}
secs=${FUZZ_SECONDS:-${3:-15}}
jobs=${FUZZ_JOBS:-1}
data=${FTP_TEST_DATA:-$src/../shared/data}
CXX=${FUZZ_CXX:-clang++}

command -v "$CXX" >/dev/null || { echo "SKIP: $CXX not found (Debian: apt-get install clang libclang-rt-14-dev)"; exit 77; }
mkdir -p "$work/fuzz" "$work/fuzz-artifacts"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

echo 'extern "C" int LLVMFuzzerTestOneInput(const unsigned char*, unsigned long) { return 0; }' >"$tmp/probe.cpp"
if ! "$CXX" -fsanitize=fuzzer "$tmp/probe.cpp" -o "$tmp/probe" 2>"$tmp/probe.err"; then
  echo "SKIP: $CXX cannot link libFuzzer (Debian: apt-get install libclang-rt-14-dev):"
  head -3 "$tmp/probe.err"
  exit 77
fi

flags=(-std=c++20 -O1 -g -fno-omit-frame-pointer -fsanitize=fuzzer,address,undefined
       -fno-sanitize-recover=undefined -I"$src/lib")
libsrc=("$src/lib/model/gguf.cpp" "$src/lib/model/llama2c.cpp" "$src/lib/model/model.cpp" "$src/lib/model/tokenizer.cpp"
        "$src/lib/model/unicode.cpp" "$src/lib/model/quant.cpp" "$src/lib/engine/quant_matmul.cpp"
        "$src/lib/model/safetensors.cpp" "$src/lib/model/hf_config.cpp" "$src/lib/model/hf_folder.cpp"
        "$src/lib/model/tokenizer_json.cpp" "$src/lib/core/json.cpp" "$src/lib/core/json_parse.cpp")
libs=(-licuuc)  # the tokenizer's Unicode classes (ICU, as in the meson build)

# Seed corpora from the real files.
mkdir -p "$tmp/seed_gguf" "$tmp/seed_llama2c" "$tmp/seed_quant" "$tmp/seed_safetensors"
sd=$data/models/stories260K
vd=$data/models/llama.cpp-vocab
for f in "$sd/stories260K.gguf"; do
  [ -f "$f" ] && cp "$f" "$tmp/seed_gguf/"
done
for f in "$sd/stories260K.bin" "$sd/tok512.bin"; do
  [ -f "$f" ] && cp "$f" "$tmp/seed_llama2c/"
done
# Small seeds too: headers alone mutate faster than megabyte files.
[ -f "$sd/stories260K.gguf" ] && head -c 16384 "$sd/stories260K.gguf" >"$tmp/seed_gguf/head.gguf"
# The vocab-only files are large; their first 64 KiB hold the header and the
# start of the token arrays.
for f in "$vd/ggml-vocab-llama-spm.gguf" "$vd/ggml-vocab-gpt-2.gguf"; do
  [ -f "$f" ] && head -c 65536 "$f" >"$tmp/seed_gguf/$(basename "$f" .gguf)-head.gguf"
done
[ -f "$sd/tok512.bin" ] && head -c 600 "$sd/tok512.bin" >"$tmp/seed_llama2c/tokhead.bin"
# A quantized model (Q2_K, 0.6 MB) for the GGUF target too: its K-quant tensor infos.
[ -f "$data/models/arch-refs/llama-Q2_K-pure.gguf" ] && cp "$data/models/arch-refs/llama-Q2_K-pure.gguf" "$tmp/seed_gguf/"
# Quant seeds: a type byte, then real blocks from the arch-refs files' tensor data (their last 4 KiB).
ad=$data/models/arch-refs
i=0
for f in "$ad"/llama-Q*.gguf; do
  [ -f "$f" ] || continue
  { printf "\\$(printf '%03o' $i)"; tail -c 4096 "$f"; } >"$tmp/seed_quant/$(basename "$f" .gguf)"
  i=$((i + 1))
done
# Safetensors seeds: TinyStories' header and first tensors (the whole file is 2.6 MB).
st=$data/models/tinystories-656k/hf/model.safetensors
[ -f "$st" ] && head -c 65536 "$st" >"$tmp/seed_safetensors/head.safetensors"
[ -n "$(ls "$tmp/seed_gguf")" ] || echo "note: no test data under $data; fuzzing from empty corpora"

status=0
for target in fuzz_gguf fuzz_llama2c fuzz_quant fuzz_safetensors; do
  exe=$work/fuzz/$target
  echo "== $target: building"
  if ! "$CXX" "${flags[@]}" "$src/tests/fuzz/$target.cpp" "${libsrc[@]}" "${libs[@]}" -o "$exe"; then
    echo "FAIL: $target does not build"
    status=1
    continue
  fi
  seed=$tmp/seed_${target#fuzz_}
  corpus=$tmp/corpus_$target
  if [ -n "${FUZZ_CORPUS:-}" ]; then corpus=$FUZZ_CORPUS/$target; fi
  mkdir -p "$corpus"
  echo "== $target: fuzzing for ${secs}s"
  (cd "$tmp" && "$exe" "$corpus" "$seed" -max_total_time="$secs" -timeout=10 -rss_limit_mb=2048 \
      -jobs="$jobs" -workers="$jobs" -print_final_stats=1 \
      -artifact_prefix="$work/fuzz-artifacts/$target-" >"$tmp/$target.log" 2>&1)
  rc=$?
  grep -E "^(#[0-9]+.*DONE|Done [0-9]+ runs|stat::number_of_executed_units)" "$tmp/$target.log" | tail -3
  if [ "$jobs" -gt 1 ]; then cat "$tmp"/fuzz-*.log 2>/dev/null | grep -E "Done [0-9]+ runs" | tail -"$jobs"; rm -f "$tmp"/fuzz-*.log; fi
  # With -jobs the parent may exit 0 while a worker crashed: look for reproducers too.
  if [ $rc -eq 0 ] && ls "$work/fuzz-artifacts/$target-"* >/dev/null 2>&1; then rc=1; fi
  if [ $rc -ne 0 ]; then
    echo "FAIL: $target exited $rc; reproducer under $work/fuzz-artifacts/"
    cat "$tmp/$target.log" "$tmp"/fuzz-*.log 2>/dev/null | grep -E "ERROR|SUMMARY|runtime error" -A12 | head -60
    status=1
  else
    echo "ok: $target, no crash"
  fi
done
exit $status
