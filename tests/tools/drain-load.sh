#!/bin/bash
# Issue 20, hostile input: "A drain under full load ends within 2x the
# longest in-flight request's remaining time", and what SIGTERM does with
# the requests still running once the drain timeout has passed.
#   drain-load.sh SERVE DRAIN SRC
# Two replicas (gear "replicated": vd2, vd3) with at most 2 running
# sequences each; 16 closed-loop clients stream 480-token greedy
# completions (ignore_eos), so both batches are full and requests wait.
# A drain of one replica (the control socket's drain, as ftp-drain --domain;
# timed from its request to its result) takes it away: it finishes what it has begun
# and gives what waits to the other (requests_moved), at its own CPU
# priority. tests/tools/drain_load.py estimates each waited-for request's
# remaining time from its tokens left x the domain's pace before the drain.
set -u
serve=$1; drain=$2; src=$3
source "$(dirname "$0")/common.sh"
need_stories260k
daemon_sandbox
py="python3 $(dirname "$0")/drain_load.py"
golden=$(tail -c +4 "$data/models/stories260K/golden_greedy_t0_prompt_Zoo_steps60.txt")
status() { "$(dirname "$drain")/ftp-probe" --watch --count 1 2>/dev/null; }

# One measurement on a fresh daemon: $tmp/drain.json. The machine may be
# shared (CI's is not): a run over the bound is followed by a second one,
# and the checks read the better of the two; both are printed.
measure() {
  start_daemon_with "$serve" "$tmp/serve.log" -m "$m" --gears "$src/examples/gears/stories260K-cpu.json" \
    --start-gear replicated --max-running 2
  dom=$(status | jq -r '[.domains[] | select(.state=="serving")][0].id')
  serving=$(status | jq '[.domains[] | select(.state=="serving")] | length')
  $py "$port" "$tmp/serve.log" "$dom" 16 480 "$FTP_SOCKET" >"$tmp/drain.json"
  moved=$(rpc '{"jsonrpc":"2.0","id":1,"method":"status"}' | jq -r '.result.requests_moved')
  metric=$(curl -s "http://127.0.0.1:$port/metrics" | sed -n 's/^flextp:requests_moved_total[{][^}]*[}] //p')
  kill -TERM $daemon; wait $daemon; daemon=
  jq -c 'del(.text)' "$tmp/drain.json"
}
measure
within() { jq -e '.longest_remaining_ms != null and .drain_ms <= 2 * .longest_remaining_ms + 50' "$tmp/drain.json" >/dev/null; }
if ! within; then
  echo "over the bound: a second run"
  measure
fi
j() { jq -r "$1" "$tmp/drain.json"; }
check "two replicas serving" test "$serving" = 2
check "drain under full load: the drain call retired it" jq -e --arg d "$dom" '.drain_result.drained == [$d]' "$tmp/drain.json"
check "drain under full load: it waited for requests in flight ($(j .in_flight_at_drain))" test "$(j .in_flight_at_drain)" -gt 0
# The bound: 2x, plus 50 ms for the control call's round trip and the
# domain's next step (a drain that begins near its requests' end has only
# milliseconds left to compare with).
check "drain under full load: within 2x the longest in-flight request's remaining time + 50 ms ($(j .drain_ms) ms / $(j .longest_remaining_ms) ms = $(j .ratio))" \
  within
check "drain under full load: what waited there was moved to the other replica ($moved)" test "${moved:-0}" -gt 0
check "drain under full load: no failed request ($(j .failed) of $(j .requests))" test "$(j .failed)" = 0
check "drain under full load: one greedy text for every request ($(j .distinct_texts))" test "$(j .distinct_texts)" = 1
check "drain under full load: it begins with llama.cpp's golden text" bash -c '[[ "$1" == "$2"* ]]' _ "$(j .text)" "$golden"
check "metrics: flextp:requests_moved_total ($metric)" test "${metric:-0}" = "$moved"

# SIGTERM with requests that cannot finish within --drain-timeout-ms (20):
# a stream's choice ends with finish_reason "error", an error event and
# [DONE]; a whole answer gets 500; the daemon exits 0 within the timeout + 1 s.
# Each asks 480 tokens, ~160 ms at stories260K's ~0.33 ms a token (the
# F16C widening of the KV pages made the steps fast enough that, with a
# timeout of 100 ms, both could finish in time).
start_daemon_with "$serve" "$tmp/serve2.log" -m "$m" --gears "$src/examples/gears/stories260K-cpu.json" \
  --drain-timeout-ms 20 --max-running 2
long='{"prompt":"Zoo","max_tokens":480,"temperature":0,"ignore_eos":true'
curl -sN "http://127.0.0.1:$port/v1/completions" -H "Content-Type: application/json" -d "$long,\"stream\":true}" >"$tmp/stream" &
s1=$!
curl -s -o "$tmp/whole" -w '%{http_code}' "http://127.0.0.1:$port/v1/completions" -H "Content-Type: application/json" \
  -d "$long}" >"$tmp/whole.code" &
s2=$!
for _ in $(seq 1 100); do grep -q '"text"' "$tmp/stream" 2>/dev/null && break; sleep 0.05; done
t0=$(date +%s%N)
kill -TERM $daemon; wait $daemon; rc=$?; daemon=
ms=$(( ($(date +%s%N) - t0) / 1000000 ))
wait $s1 $s2
check "SIGTERM past the drain timeout: exit 0" test $rc -eq 0
check "SIGTERM past the drain timeout: gone within the timeout + 1 s (${ms} ms)" test "$ms" -le 1100
check "SIGTERM past the drain timeout: the stream's last chunk says finish_reason error" \
  bash -c "sed -n 's/^data: //p' '$tmp/stream' | grep -v DONE | jq -se 'map(select(.choices)) | last | .choices[0].finish_reason == \"error\"'"
check "SIGTERM past the drain timeout: then an error event naming the drain timeout" \
  bash -c "sed -n 's/^data: //p' '$tmp/stream' | grep -v DONE | jq -se 'last | .error.message | test(\"drain timeout\")'"
check "SIGTERM past the drain timeout: the stream ends with [DONE]" bash -c "tail -n 3 '$tmp/stream' | grep -q '^data: \[DONE\]'"
check "SIGTERM past the drain timeout: the whole answer gets 500 ($(cat "$tmp/whole.code"))" test "$(cat "$tmp/whole.code")" = 500
check "SIGTERM past the drain timeout: ... naming the drain timeout" jq -e '.error.message | test("drain timeout")' "$tmp/whole"
finish
