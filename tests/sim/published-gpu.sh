#!/bin/bash
# The simulated engine (ftp-plan simulate) against a published GPU serving
# result: vLLM 0.23.0 serving Llama-3.1-8B-Instruct (BF16) on one
# A100-SXM4-40GB, `vllm bench serve --dataset-name random
# --random-input-len 1024 --random-output-len 128 --ignore-eos
# --max-concurrency C --num-prompts 20C --request-rate inf` for C = 1..64
# (J. Musgrave, "vLLM throughput-latency sweep on NVIDIA A100",
# https://johnmusgrave.com/p/vllm-throughput-latency-sweep-on). The figures
# compared (the page's own summary): decode of one request at a time at about
# 75 tokens/s (TPOT 13.3 ms), and output throughput at C = 8 6.6 x that of
# C = 1. The closed loop of C clients is replayed as an open-loop arrival
# rate far above capacity with --max-running C and no tail: the domain
# always holds C requests and admits the next as one finishes, as the
# benchmark's clients do. The calibration is the datasheet default
# (examples/calibrations/gpu-datasheet.json); the device's peaks come from
# examples/clusters/a100-40gb-1x.json. Prints each figure, published vs
# simulated, the ratio and whether it is within 15 %; --check exits 6 when
# one is not. Deterministic (virtual time): the ratios are the same on any
# machine.
# Usage: published-gpu.sh BUILD_DIR [--check] [--calibration FILE]
set -u
build=${1:?usage: $0 BUILD_DIR [--check] [--calibration FILE]}; shift
root=$(cd "$(dirname "$0")/../.." && pwd)
check=0; cal=$root/examples/calibrations/gpu-datasheet.json
while [ $# -gt 0 ]; do
  case $1 in
    --check) check=1 ;;
    --calibration) cal=${2:?--calibration needs a file}; shift ;;
    *) echo "usage: $0 BUILD_DIR [--check] [--calibration FILE]" >&2; exit 2 ;;
  esac
  shift
done
plan=$build/tools/ftp-plan
[ -x "$plan" ] || { echo "published-gpu: $plan not found (build first)" >&2; exit 1; }
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT

# One saturated replay with C in flight: prints "decode_tokens_s tpot_p50_ms".
run() {
  "$plan" simulate --topology "$root/examples/clusters/a100-40gb-1x.json" \
    --model "$root/examples/models/llama-3.1-8b.json" --calibration "$cal" --policy static:standard \
    --rate-pattern const:20 --duration 120 --tail-s 0 --max-running "$1" \
    --prompt-lengths 1024 --output-lengths 128 --interval 1000 --summary "$tmp/c$1.json" >/dev/null || exit 1
  jq -r '"\(.decode_tokens_s) \(.p50.tpot_ms)"' "$tmp/c$1.json"
}
read -r tput1 tpot1 < <(run 1)
read -r tput8 tpot8 < <(run 8)

# name, published, simulated
rows=$(awk -v t1="$tput1" -v p1="$tpot1" -v t8="$tput8" -v p8="$tpot8" 'BEGIN {
  printf "C=1 decode tokens/s (1000/TPOT)\t75\t%.2f\n", 1000 / p1
  printf "C=1 TPOT ms\t13.33\t%.2f\n", p1
  printf "C=8 / C=1 output throughput\t6.6\t%.3f\n", t8 / t1
}')
echo "published: vLLM 0.23.0, Llama-3.1-8B BF16, 1x A100-40GB, 1024 in / 128 out (johnmusgrave.com)"
echo "simulated: ftp-plan simulate, calibration $(basename "$cal"); C=1 ${tput1} tok/s, C=8 ${tput8} tok/s, C=8 TPOT P50 ${tpot8} ms"
printf '%-34s %10s %10s %8s %s\n' figure published sim sim/pub "within 15 %"
bad=0
while IFS=$'\t' read -r name pub sim; do
  ratio=$(awk -v a="$sim" -v b="$pub" 'BEGIN { printf "%.3f", a / b }')
  ok=$(awk -v r="$ratio" 'BEGIN { print (r >= 0.85 && r <= 1.15) ? "yes" : "NO" }')
  [ "$ok" = yes ] || bad=1
  printf '%-34s %10s %10s %8s %s\n' "$name" "$pub" "$sim" "$ratio" "$ok"
done <<<"$rows"
if [ "$check" = 1 ] && [ "$bad" = 1 ]; then
  echo "published-gpu: a figure is off by more than 15 % (--check)" >&2
  exit 6
fi
exit 0
