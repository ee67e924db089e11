#!/bin/bash
# Issue 20, hostile clients of the HTTP layer, against a live ftp-serve
# --engine sim (no weights): 60 MB of headers (431, RSS), a 100 MB body
# (413 before it is read), slowloris (item 2), SIGTERM with slow clients
# (item 3), pipelining (item 5), 415 and a negative Content-Length (item 8),
# the read timeouts (408 for a stalled request, an idle one closed).
set -u
tools=$1; src=$2
source "$(dirname "$0")/common.sh"
py="python3 $(dirname "$0")/http_hostile.py"
ulimit -n "$(ulimit -Hn)" 2>/dev/null
daemon_sandbox
"$tools/ftp-probe" --cluster "$src/examples/clusters/a100-8x-nvlink.json" >"$tmp/topo.json"
start_daemon_with "$tools/ftp-serve" "$tmp/serve.log" --engine sim -m "$src/examples/models/llama-70b.json" \
  --topology "$tmp/topo.json" --gear tp=8 --drain-timeout-ms 2000
rss_kb() { awk -v k="$1" '$1 == k":" {print $2}' "/proc/$daemon/status"; }
threads() { ls "/proc/$daemon/task" | wc -l; }

# 60 MB of headers: 431 once the limit is passed, the rest never held.
before=$(rss_kb VmRSS)
read -r code sent < <($py headers "$port" 60)
peak=$(rss_kb VmHWM)
echo "60 MB headers: status $code after $((sent / 1048576)) MB sent; peak RSS growth $(( (peak - before) / 1024 )) MB"
check "load: 60 MB of headers: 431" test "$code" = 431
check "load: 60 MB of headers: RSS growth <= 10 MB" test $(( (peak - before) )) -le 10240

# A 100 MB body: 413 from its Content-Length, before a byte of it is sent.
check "load: a 100 MB body: 413 before it is read" test "$($py body "$port" 100)" = 413

# Item 8: 415 for a POST that is not JSON; -5 as Content-Length: 400 at once.
code=$(curl -s -o /dev/null -w '%{http_code}' "http://127.0.0.1:$port/v1/completions" -H 'Content-Type: text/plain' \
  -d '{"prompt":"Zoo","max_tokens":2}')
check "8: Content-Type text/plain: 415" test "$code" = 415
code=$(curl -s -o /dev/null -w '%{http_code}' "http://127.0.0.1:$port/v1/completions" -d '{"prompt":"Zoo"}')
check "8: curl -d's form type: 415" test "$code" = 415
start=$(date +%s%N)
code=$(printf 'POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: -5\r\n\r\n' |
  socat -t 10 - "TCP:127.0.0.1:$port" | head -1 | cut -d' ' -f2)
ms=$(( ($(date +%s%N) - start) / 1000000 ))
check "8: Content-Length -5: 400" test "$code" = 400
check "8: Content-Length -5: answered at once (${ms} ms, not a timeout)" test "$ms" -lt 2000
hdrs=$(for i in $(seq 1 20000); do printf 'X-%d: 1\r\n' "$i"; done)
code=$( { printf 'GET /health HTTP/1.1\r\nHost: x\r\n'; printf '%s' "$hdrs"; printf '\r\n'; } |
  socat -t 10 - "TCP:127.0.0.1:$port" 2>/dev/null | head -1 | cut -d' ' -f2)
check "8: 20,000 headers: 431" test "$code" = 431

# Item 5: three pipelined requests in one write get three answers.
check "5: 3 pipelined requests: 3 answers" test "$($py pipelined "$port")" = 3

# Item 2: under 300 slowloris connections a normal request is served within 1 s.
t0=$(threads)
$py slow "$port" 300 8 >"$tmp/slow.out" &
slow=$!
for _ in $(seq 1 100); do grep -q open "$tmp/slow.out" && break; sleep 0.1; done
sleep 1
read -r ms code < <($py timed "$port" 1)
echo "2: a completion under $(cut -d' ' -f2 "$tmp/slow.out") slowloris connections: ${ms} ms (status $code); threads $t0 -> $(threads)"
check "2: under 300 slowloris connections: 200" test "$code" = 200
check "2: under 300 slowloris connections: served within 1 s" awk -v m="$ms" 'BEGIN {exit !(m < 1000)}'
check "2: slowloris connections take no thread" test "$(threads)" -eq "$t0"
kill "$slow" 2>/dev/null; wait "$slow" 2>/dev/null

# Item 3: SIGTERM with 20 slow clients ends within --drain-timeout-ms + 1 s.
$py slow "$port" 20 30 >"$tmp/slow20.out" &
slow=$!
for _ in $(seq 1 100); do grep -q open "$tmp/slow20.out" && break; sleep 0.1; done
start=$(date +%s%N)
kill -TERM "$daemon"; wait "$daemon"; rc=$?; daemon=
ms=$(( ($(date +%s%N) - start) / 1000000 ))
echo "3: SIGTERM with 20 slow clients: exit $rc after ${ms} ms (drain timeout 2000 ms)"
check "3: SIGTERM with 20 slow clients: exit 0" test $rc -eq 0
check "3: SIGTERM with 20 slow clients: within the drain timeout + 1 s" test "$ms" -le 3000
kill "$slow" 2>/dev/null; wait "$slow" 2>/dev/null

# Read timeouts ("request and idle read timeouts: 408"): a request that has
# begun and stalls gets 408 at --header-timeout-ms; a kept-alive connection
# that starts no new request, like one that never sent a byte, is closed at
# --idle-timeout-ms without an answer (RFC 9112 section 9.5: a 408 there
# would race a request the client is sending; nginx and uvicorn close
# silently too). Bounds: the timeout, plus 1 s for a loaded 2-core machine.
start_daemon_with "$tools/ftp-serve" "$tmp/serve2.log" --engine sim -m "$src/examples/models/llama-70b.json" \
  --topology "$tmp/topo.json" --gear tp=8 --header-timeout-ms 1500 --idle-timeout-ms 1000
read -r code ms < <($py stall "$port")
echo "timeouts: half a header, then nothing: status $code after $ms ms (--header-timeout-ms 1500)"
check "timeouts: a request that stalls in its headers: 408" test "$code" = 408
check "timeouts: the 408 comes at --header-timeout-ms" test "$ms" -ge 1400 -a "$ms" -le 2500
read -r ms bytes < <($py idle "$port")
echo "timeouts: kept-alive after an answer: closed $ms ms later, $bytes bytes sent (--idle-timeout-ms 1000)"
check "timeouts: an idle kept-alive connection is closed without an answer" test "$bytes" = 0
check "timeouts: ... at --idle-timeout-ms" test "$ms" -ge 900 -a "$ms" -le 2000
read -r ms bytes < <($py silent "$port")
echo "timeouts: a connection that sends nothing: closed after $ms ms, $bytes bytes sent"
check "timeouts: a connection that sends nothing is closed without an answer" test "$bytes" = 0
check "timeouts: ... at --idle-timeout-ms" test "$ms" -ge 900 -a "$ms" -le 2000
finish
