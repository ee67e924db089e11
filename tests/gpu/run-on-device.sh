#!/bin/bash
# The prepared device check of the CUDA backend (issue 7): on a machine with a
# GPU and the CUDA toolkit (e.g. the lent H200), runs the gpu suite's programs
# and the decode benchmark from a pack made by tests/gpu/pack-for-device.sh,
# and prints everything the issue note needs. Under 8 minutes on an H200
# (the 8 B model is written, loaded and uploaded once: ~2-3 minutes of it).
#
# usage: tests/gpu/run-on-device.sh [PACK_DIR] [--quick] [--batches LIST] [--ab SETTINGS]
#   PACK_DIR   default .device
#   --quick    the benchmark on the tiny shape only
#   --batches  decode batches of the 8 B runs (default 1,8,64)
#   --ab       A/B runs after the main one: the 8 B decode (no GEMV sweep)
#              again under each ';'-separated group of environment settings,
#              e.g. 'FTP_GEMV_CONFIG=8x4;FTP_GEMV_MAX_ROWS=1' (the model file
#              is written once and reused)
# Logs go to $OUT (the device tool's output folder) when it is set.
# FTP_DEVICE_BUDGET (seconds, default 540): no program runs past it, so a
# hang in one still leaves the summary line and the logs inside the lease.
set -u
pack=.device
case ${1:-} in --*|'') ;; *) pack=$1; shift ;; esac
quick=0; batches=1,8,64; ab=
while [ $# -gt 0 ]; do
  case $1 in
    --quick) quick=1 ;;
    --batches) batches=$2; shift ;;
    --ab) ab=$2; shift ;;
    *) echo "run-on-device: unknown option $1"; exit 2 ;;
  esac
  shift
done
log_dir=${OUT:-$(mktemp -d)}
work=/tmp/ftp-gpu
# The pack unpacked, its libraries and this machine's CUDA libraries (device-env.sh).
source "$(dirname "$0")/device-env.sh"
unpack_pack "$pack" "$work" || exit 1
device_env "$work" || exit 1
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm,clocks.max.mem --format=csv 2>/dev/null

pass=0; fail=0; skip=0
deadline=$((SECONDS + ${FTP_DEVICE_BUDGET:-540}))
device_run gpu 60 "$work/bin/test-gpu"
device_run gpu-kernels 120 "$work/bin/test-kernels"
device_run gpu-engine 150 "$work/bin/test-cuda-engine"
device_run gpu-bench-tiny 60 "$work/bin/gpu-bench" --shape tiny --steps 4 --prompt 8
if [ $quick -eq 0 ]; then
  device_run gpu-bench-8b 360 "$work/bin/gpu-bench" --shape 8b --dir /tmp/ftp-bench --steps 32 --prompt 32 --batches "$batches" \
    --memory-check
  IFS=';' read -ra settings <<< "$ab"
  i=0
  for setting in "${settings[@]}"; do
    i=$((i + 1))
    echo "=== A/B $i: $setting"
    # Word splitting of $setting is wanted: several VAR=VALUE words.
    # shellcheck disable=SC2086
    device_run "gpu-bench-8b-ab$i" 120 env $setting "$work/bin/gpu-bench" --shape 8b --dir /tmp/ftp-bench --steps 32 --prompt 32 \
      --batches "$batches" --no-gemv-sweep
  done
fi
echo "run-on-device: $pass passed, $fail failed, $skip skipped"
[ $fail -eq 0 ] && [ $skip -eq 0 ]
