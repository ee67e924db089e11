#!/bin/bash
# ftp-gear-bench against a live ftp-serve on the CPU, then the same command
# against ftp-serve --engine sim calibrated on this machine in the same run
# (sim-fidelity --write-calibration); prints per-rate TTFT/TPOT percentiles
# and throughput, real vs sim with the ratio, and the capacity (max_rps) of
# each. The goal is agreement within 15 %; it reports, it does not gate
# (exit 0 whatever the ratios) unless --check is given (then exit 6).
# The calibration runs with --split 1: ftp-serve --gear tp=1 puts its rank on
# vd0 of one virtual device, all CPUs.
# Usage: sim-gear-bench.sh BUILD_DIR [stories260K|synthetic] [--check] [--sweep R1,R2,..]
set -u
build=$1; shift
which=synthetic; check=0; sweep=
while [ $# -gt 0 ]; do
  case $1 in
    stories260K|synthetic) which=$1 ;;
    --check) check=1 ;;
    --sweep) sweep=$2; shift ;;
    *) echo "usage: $0 BUILD_DIR [stories260K|synthetic] [--check] [--sweep R1,R2,..]" >&2; exit 2 ;;
  esac
  shift
done
data=${FTP_TEST_DATA:-}
tmp=$(mktemp -d)
daemon=
cleanup() { [ -n "$daemon" ] && kill -9 "$daemon" 2>/dev/null; rm -rf "$tmp"; }
trap cleanup EXIT
export FTP_SOCKET=$tmp/control.sock
source "$(dirname "$0")/../tools/common.sh"

if [ "$which" = stories260K ]; then
  model=$data/models/stories260K/stories260K.gguf
  [ -f "$model" ] || { echo "SKIP: $model not found (set FTP_TEST_DATA)"; exit 77; }
  "$build/tests/bench/sim-fidelity" --models stories260K --stories "$model" --requests 30 --split 1 \
    --write-calibration "$tmp/cal.json" --json=short >"$tmp/fidelity.json" 2>"$tmp/fidelity.txt" || exit 1
  : "${sweep:=50,100,200,400,800}"; slo="--slo-ttft-ms 20 --slo-tpot-ms 2"
else
  model=$tmp/synthetic.gguf
  "$build/tests/bench/sim-fidelity" --models synthetic --synthetic-path "$model" --requests 30 --split 1 \
    --write-calibration "$tmp/cal.json" --json=short >"$tmp/fidelity.json" 2>"$tmp/fidelity.txt" || exit 1
  : "${sweep:=2,4,8,16,32}"; slo="--slo-ttft-ms 1000 --slo-tpot-ms 100"
fi
echo "calibration ($which): $(grep 'calibration from' "$tmp/fidelity.txt")" >&2

bench() {  # NAME SERVE_ARGS...
  local name=$1; shift
  start_daemon_with "$build/tools/ftp-serve" "$tmp/$name.log" -m "$model" --gear tp=1 "$@"
  # shellcheck disable=SC2086
  "$build/tools/ftp-gear-bench" --url "http://127.0.0.1:$port" --gear tp1 --sweep "$sweep" --requests 40 \
    --prompt-tokens 32 --output-tokens 32 --seed 7 $slo --json=short >"$tmp/$name.json"
  local rc=$?
  kill -TERM "$daemon"; wait "$daemon"; daemon=
  [ $rc -eq 0 ] || { echo "ftp-gear-bench against $name failed ($rc)" >&2; exit 1; }
}
bench real
bench sim --engine sim --calibration "$tmp/cal.json" --topology "$tmp/cal.json.topology.json"

jq -rn --slurpfile r "$tmp/real.json" --slurpfile s "$tmp/sim.json" '
  def row($name; $a; $b): [$name, ($a*1000|round/1000), ($b*1000|round/1000),
    (if $a > 0 then ($b/$a*1000|round/1000) else "-" end),
    (if $a > 0 and (($b/$a) - 1 | fabs) <= 0.15 then "yes" else "NO" end)] | @tsv;
  ["rate", "metric", "real", "sim", "sim/real", "within 15 %"] | @tsv,
  ( [$r[0].runs, $s[0].runs] | transpose[] | select(.[0] != null and .[1] != null) | . as [$a, $b]
    | ($a.offered_rps | tostring) as $rate
    | (row("TTFT P50 ms"; $a.ttft_ms.p50; $b.ttft_ms.p50), row("TTFT P99 ms"; $a.ttft_ms.p99; $b.ttft_ms.p99),
       row("TPOT P50 ms"; $a.tpot_ms.p50; $b.tpot_ms.p50), row("TPOT P99 ms"; $a.tpot_ms.p99; $b.tpot_ms.p99),
       row("req/s"; $a.request_throughput; $b.request_throughput)) | "\($rate)\t\(.)" ),
  "capacity\t" + row("max_rps"; ($r[0].capacity.max_rps // 0); ($s[0].capacity.max_rps // 0)),
  "runs sustained\treal \([$r[0].runs[] | select(.sustainable)] | length)/\($r[0].runs | length)\tsim \([$s[0].runs[] | select(.sustainable)] | length)/\($s[0].runs | length)"
' | column -t -s $'\t' | tee "$tmp/table.txt"
if [ $check -eq 1 ] && grep -q NO "$tmp/table.txt"; then exit 6; fi
exit 0
