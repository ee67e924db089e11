#!/bin/bash
# Issue 20: the HTTP library chosen by measurement. Each candidate
# (build/tests/bench/http-candidates: cpp-httplib, libmicrohttpd, lib/http)
# serves GET / in turn; for each, in one run: threads and RSS with N kept-
# alive idle connections, and a normal GET's latency with 300 slowloris
# connections open (a header byte per second each), and how many of those
# the server still holds after 15 s (a whole-header deadline cuts them).
#   tests/bench/http-candidates.sh build     [N=2000]
set -u
build=$1; N=${N:-2000}
py="python3 $(dirname "$0")/../tools/http_hostile.py"
bin=$build/tests/bench/http-candidates
[ -x "$bin" ] || { echo "SKIP: $bin not built (libmicrohttpd-dev missing?)"; exit 77; }
ulimit -n "$(ulimit -Hn)" 2>/dev/null
port=$((20000 + RANDOM % 20000))
printf '%-8s %8s %12s %10s %14s %18s %15s\n' server threads "threads+$N" "RSS+$N MB" "answered/$N" "GET|300 slowloris" "slow held 15 s"
for s in httplib mhd flextp; do
  "$bin" "$s" "$port" >/tmp/cand.$$ 2>&1 &
  pid=$!
  for _ in $(seq 1 100); do grep -q listening /tmp/cand.$$ && break; sleep 0.05; done
  t0=$(ls /proc/$pid/task | wc -l); r0=$(awk '$1 == "VmRSS:" {print $2}' /proc/$pid/status)
  $py keep "$port" "$N" 4 >/tmp/keep.$$ &
  k=$!
  for _ in $(seq 1 300); do grep -q open /tmp/keep.$$ && break; sleep 0.1; done
  answered=$(awk '{print $4}' /tmp/keep.$$)
  t1=$(ls /proc/$pid/task | wc -l); r1=$(awk '$1 == "VmRSS:" {print $2}' /proc/$pid/status)
  wait $k
  sleep 1
  $py slow "$port" 300 15 >/tmp/slow.$$ &
  sl=$!
  for _ in $(seq 1 300); do grep -q open /tmp/slow.$$ && break; sleep 0.1; done
  sleep 2
  g=$($py get "$port" 10)
  wait $sl 2>/dev/null
  alive=$(awk '$1 == "alive" {print $2}' /tmp/slow.$$)
  kill $pid; wait $pid 2>/dev/null
  printf '%-8s %8s %12s %10s %14s %18s %15s\n' "$s" "$t0" "$t1" "$(( (r1 - r0) / 1024 ))" "$answered" "$g ms" "$alive/300"
  port=$((port + 1))
done
rm -f /tmp/cand.$$ /tmp/keep.$$ /tmp/slow.$$
