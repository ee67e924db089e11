#!/bin/bash
# The prepared device check of issue 19 (block-type quantization on the CUDA
# backend), for a lent GPU: one call after tests/gpu/issue17-on-device.sh
# (or alone), over the same pack (tests/gpu/pack-for-device.sh). It runs
#   - test-kernels and test-cuda-engine (their block-type checks: decoders,
#     activation quantization, the GEMV on the integer and float paths,
#     synthetic Q4_K_M and Q4_0 logits against the CPU backend) unless
#     --no-tests (issue17-on-device.sh has run them already);
#   - gpu-bench on the 8 B shape in Q4_K_M, then Q4_0 (batch 1 and 8; the
#     GEMV sweep at batches 1-8), where time is left;
#   - the Q4_K_M decode again on the float path (FTP_CUDA_INT8_DOTS=0),
#     reusing the model file, for the A/B of the two dot paths;
# and prints the lines issue 19 asks for: each type's batch-1 decode as a
# fraction of the triad measured in the same run (goal >= 0.8 for Q4_K_M).
# Every step has a time limit; the run stays within FTP_ISSUE19_BUDGET
# seconds (default 500), so a hang still leaves the summary inside a
# 10-minute device call. Logs go to $OUT when it is set.
#
# usage: tests/gpu/issue19-on-device.sh [PACK_DIR] [--no-tests] [--dtypes LIST]
#   PACK_DIR  default .device
#   --dtypes  the 8 B files to time, in order (default q4_k_m,q4_0)
set -u
pack=.device
case ${1:-} in --*|'') ;; *) pack=$1; shift ;; esac
tests=1; dtypes=q4_k_m,q4_0
while [ $# -gt 0 ]; do
  case $1 in
    --no-tests) tests=0 ;;
    --dtypes) dtypes=$2; shift ;;
    *) echo "issue19-on-device: unknown option $1"; exit 2 ;;
  esac
  shift
done
here=$(cd "$(dirname "$0")" && pwd)
log_dir=${OUT:-$(mktemp -d)}
work=/tmp/ftp-gpu
source "$here/device-env.sh"
[ -x "$work/bin/gpu-bench" ] || unpack_pack "$pack" "$work" || exit 1
device_env "$work" >/dev/null || exit 1

budget=${FTP_ISSUE19_BUDGET:-500}
deadline=$((SECONDS + budget))
pass=0; fail=0; skip=0; device_min_step=30
if [ $tests -eq 1 ]; then
  device_run gpu-kernels 120 "$work/bin/test-kernels"
  device_run gpu-engine 150 "$work/bin/test-cuda-engine"
fi
IFS=',' read -ra types <<< "$dtypes"
for d in "${types[@]}"; do
  device_run "gpu-bench-8b-$d" 200 "$work/bin/gpu-bench" --shape 8b --dtype "$d" --dir /tmp/ftp-bench \
    --steps 32 --prompt 32 --batches 1,8 --sweep-batches 1,2,4,8
done
case ",$dtypes," in
  *,q4_k_m,*) device_run gpu-bench-8b-q4_k_m-float 120 env FTP_CUDA_INT8_DOTS=0 "$work/bin/gpu-bench" \
                --shape 8b --dtype q4_k_m --dir /tmp/ftp-bench --steps 32 --prompt 32 --batches 1 --no-gemv-sweep ;;
esac

echo "=== issue 19 summary"
grep -h -E "^FAIL|synthetic Q4_(K_M|0)|matvec int8 dots|info matvec Q" "$log_dir/gpu-kernels.log" "$log_dir/gpu-engine.log" 2>/dev/null | head -40
for f in "$log_dir"/gpu-bench-8b-*.log; do
  [ -f "$f" ] || continue
  echo "--- $(basename "$f" .log)"
  grep -h -E "^decode batch +(1|8):|triad" "$f" | head -6
done
echo "issue19-on-device: $pass passed, $fail failed, $skip skipped"
[ $fail -eq 0 ] && [ $skip -eq 0 ]
