#!/bin/bash
# Issue 20's load items, printed as ratios measured in one run against one
# simulated daemon (ftp-serve --engine sim: no weights, the cost model's
# time): a normal client's completion P99 with 1,000 slowloris connections
# open against an unloaded run, and 5,000 concurrent idle SSE streams with
# the daemon's threads and RSS before and after.
#   tests/bench/http-load.sh build/tools .     [SLOW=1000 SSE=5000 K=60]
set -u
tools=$1; src=$2
SLOW=${SLOW:-1000}; SSE=${SSE:-5000}; K=${K:-60}
here=$(dirname "$0")
py="python3 $here/../tools/http_hostile.py"
source "$here/../tools/common.sh"
ulimit -n "$(ulimit -Hn)" 2>/dev/null
[ "$(ulimit -n)" -ge $((SSE + SLOW + 100)) ] || { echo "ulimit -n $(ulimit -n) is under $((SSE + SLOW + 100))"; exit 1; }
daemon_sandbox
"$tools/ftp-probe" --cluster "$src/examples/clusters/a100-8x-nvlink.json" >"$tmp/topo.json"
start_daemon_with "$tools/ftp-serve" "$tmp/serve.log" --engine sim -m "$src/examples/models/llama-70b.json" \
  --topology "$tmp/topo.json" --gear tp=8 --header-timeout-ms 600000 \
  --max-connections $((SSE + SLOW + 100)) --max-connections-per-address $((SSE + SLOW + 100))
rss_mb() { awk '$1 == "VmRSS:" {printf "%d", $2 / 1024}' "/proc/$daemon/status"; }
threads() { ls "/proc/$daemon/task" | wc -l; }
p99() { sort -n | awk '{v[NR] = $1} END {i = int(NR * 0.99 + 0.999); if (i > NR) i = NR; print v[i]}'; }

$py timed "$port" 5 >/dev/null  # warm-up
$py timed "$port" "$K" | cut -d' ' -f1 >"$tmp/unloaded"
$py slow "$port" "$SLOW" 3600 >"$tmp/slow.out" &
slow=$!
for _ in $(seq 1 600); do grep -q open "$tmp/slow.out" && break; sleep 0.1; done
sleep 2
$py timed "$port" "$K" | cut -d' ' -f1 >"$tmp/loaded"
kill "$slow"; wait "$slow" 2>/dev/null
u=$(p99 <"$tmp/unloaded"); l=$(p99 <"$tmp/loaded")
echo "slowloris: $(cut -d' ' -f2 "$tmp/slow.out") connections, completion P99 unloaded $u ms, loaded $l ms, ratio $(awk -v a="$l" -v b="$u" 'BEGIN {printf "%.2f", a / b}') (bound 1.5)"

sleep 1
t0=$(threads); r0=$(rss_mb)
$py sse "$port" "$SSE" 3600 >"$tmp/sse.out" &
sse=$!
for _ in $(seq 1 1200); do grep -q open "$tmp/sse.out" && break; sleep 0.1; done
sleep 3
t1=$(threads); r1=$(rss_mb)
# The streams the service holds (running or waiting), whichever names the metrics have.
held=$(curl -s "http://127.0.0.1:$port/metrics" |
  awk '$1 ~ /^(ftp_requests_running|ftp_requests_waiting|vllm:num_requests_running|vllm:num_requests_waiting)$/ {n += $2} END {print n + 0}')
echo "idle SSE: $(cut -d' ' -f2 "$tmp/sse.out") streams open, $held in the service, threads $t0 -> $t1, RSS $r0 -> $r1 MB (growth $((r1 - r0)) MB, bound 200)"
kill "$sse"; wait "$sse" 2>/dev/null
kill -TERM "$daemon"; wait "$daemon"; daemon=
