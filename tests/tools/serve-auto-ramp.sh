#!/bin/bash
# ftp-serve --auto runs an urgent decision with the decision's own ramp
# (`ramp`, `ramp_step_ms` of ftp.decision/v1), not the daemon's: a queue of
# prompt tokens over urgent_backlog_s of economy's prefill shifts up at once,
# and the shift's journal shows the policy's shares, 25 % then 100 %. The
# daemon's own ramp waits 10 min a step here, so a shift that took the
# daemon's ramp would neither show these shares nor commit within the wait.
# Fixtures: the measured stories260K table with hand-set token capacities
# (economy prefills 1 token/s: a few queued prompts are seconds of backlog).
set -u
tools=$1; src=$2
source "$(dirname "$0")/common.sh"
need_stories260k
daemon_sandbox
burst=()
trap 'kill "${burst[@]}" 2>/dev/null; [ -n "$daemon" ] && kill -9 "$daemon" 2>/dev/null; rm -rf "$tmp"' EXIT

jq '(.gears[] | select(.name == "economy") | .measured) += {"prefill_tokens_s": 1, "decode_tokens_s": 1000}
  | (.gears[] | select(.name == "standard") | .measured) += {"prefill_tokens_s": 100000, "decode_tokens_s": 100000}' \
  "$src/examples/gears/stories260K-cpu-measured.json" >"$tmp/gears.json"
jq '.gear_shifter += {"urgent_backlog_s": 2, "urgent_ramp": [0.25, 1.0], "urgent_ramp_step_s": 0.05}' \
  "$src/tests/tools/fixtures/fast-policy.json" >"$tmp/policy.json"
start_daemon_with "$tools/ftp-serve" "$tmp/serve.log" -m "$m" --gears "$tmp/gears.json" --max-running 2 \
  --ramp 0.1,0.5,1.0 --step-interval-ms 600000 --virtual-devices 4 --auto --policy "$tmp/policy.json" \
  --observe-interval-ms 200
check "starts on economy" test "$("$tools/ftp-probe" --watch --count 1 | jq -r .gear)" = economy

for i in $(seq 1 8); do
  ( while :; do
      curl -s "http://127.0.0.1:$port/v1/completions" -H "Content-Type: application/json" \
        -d '{"prompt":"Once upon a time","max_tokens":24}' >/dev/null
    done ) &
  burst+=($!)
done
journal=$tmp/state/shifts.jsonl
committed() { jq -se 'any(.[]; .phase == "done" and .to == "standard")' "$journal"; }
for _ in $(seq 1 300); do committed >/dev/null 2>&1 && break; sleep 0.1; done
kill "${burst[@]}" 2>/dev/null; wait "${burst[@]}" 2>/dev/null; burst=()

check "the decision was urgent" grep -q "auto: decision shift economy -> standard: up: urgent, token backlog" "$tmp/serve.log"
check "the shift committed (the decision's 50 ms steps, not the daemon's 10 min)" committed
check "the shift ramped 25 %, 100 % as the decision says" \
  jq -se '[.[] | select(.to == "standard" and .phase == "ramp") | .traffic_share] == [0.25, 1]' "$journal"
check "the journal names the policy as trigger" \
  jq -se 'any(.[]; .to == "standard" and .phase == "done" and .trigger == "policy:gear-shifter")' "$journal"
finish
