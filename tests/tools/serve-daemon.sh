#!/bin/bash
# ftp-serve as a daemon with ftp-shift and ftp-drain: HTTP completions,
# shifts with --follow, named refusals, rollback (exit 6), decisions from
# stdin, a client killed mid-stream, SIGTERM in the middle of a shift.
set -u
serve=$1; shift_tool=$2; drain=$3; src=$4
source "$(dirname "$0")/common.sh"
need_stories260k
daemon_sandbox

start_daemon() {  # STEP_INTERVAL_MS
  start_daemon_with "$serve" "$tmp/serve.log" -m "$m" --gears "$src/examples/gears/stories260K-cpu.json" --step-interval-ms "$1" \
    --enable-test-hooks
}
complete() {  # PROMPT MAX_TOKENS
  curl -s "http://127.0.0.1:$port/v1/completions" -H "Content-Type: application/json" -d "{\"prompt\":\"$1\",\"max_tokens\":$2,\"temperature\":0}"
}

"$serve" -m "$m" --gears "$src/examples/gears/stories260K-cpu.json" --virtual-devices 2 --port 0 2>"$tmp/err"; rc=$?
check "gear outside the virtual devices: exit 2" test $rc -eq 2
check "gear outside the virtual devices: path" grep -qF 'gears[3].replicas[0].stages[0].devices[2]: unknown device "vd2"' "$tmp/err"

"$serve" -m "$m" --gears "$src/examples/gears/stories260K-cpu.json" --ramp 0.5,0.2,1.0 --port 0 2>"$tmp/err"; rc=$?
check "--ramp that does not increase: exit 2" test $rc -eq 2
check "--ramp that does not increase: named" grep -qF -- '--ramp: shares must increase, got 0.5,0.2,1' "$tmp/err"

start_daemon 100
golden=$(tail -c +4 "$data/models/stories260K/golden_greedy_t0_prompt_Zoo_steps60.txt")
check "completion: golden text" test "$(complete Zoo 57 | jq -r '.choices[0].text')" = "$golden"

"$shift_tool" --to standard --follow >"$tmp/shift.jsonl"; rc=$?
check "shift: exit 0" test $rc -eq 0
check "shift: phases in order" test "$(jq -r .phase "$tmp/shift.jsonl" | tr '\n' ' ')" = "reserve warm ramp ramp ramp drain retire done "
check "shift: ramp 10 50 100" test "$(jq -r 'select(.phase=="ramp").traffic_share' "$tmp/shift.jsonl" | tr '\n' ' ')" = "0.1 0.5 1 "
check "shift: committed record" jq -se '.[-1].outcome=="committed" and .[-1].from=="economy" and .[-1].to=="standard"' "$tmp/shift.jsonl"
check "after shift: same golden text" test "$(complete Zoo 57 | jq -r '.choices[0].text')" = "$golden"

"$shift_tool" --to standard 2>"$tmp/err"; rc=$?
check "same gear: exit 2" test $rc -eq 2
check "same gear: named" grep -q "ftp.SameGear" "$tmp/err"
"$shift_tool" --to turbo 2>"$tmp/err"; rc=$?
check "unknown gear: exit 2" test $rc -eq 2
check "unknown gear: named" grep -q "ftp.NoSuchGear" "$tmp/err"
"$shift_tool" --to performance --inject-fault check >"$tmp/rb.json"; rc=$?
check "rollback: exit 6" test $rc -eq 6
check "rollback: record" jq -e '.outcome=="rolled-back"' "$tmp/rb.json"
check "rollback: still standard" test "$(complete Zoo 57 | jq -r '.choices[0].text')" = "$golden"

# A second shift while one runs: refused by name, or queued with --queue.
"$shift_tool" --to performance --step-interval 300 >/dev/null &
first=$!
sleep 0.3
"$shift_tool" --to economy 2>"$tmp/err"; rc=$?
check "shift during a shift: refused" grep -q "ftp.ShiftInProgress" "$tmp/err"
"$shift_tool" --to economy --queue >"$tmp/queued.json"; rc=$?
wait $first
check "--queue: waits, then shifts" jq -e '.outcome=="committed" and .from=="performance" and .to=="economy"' "$tmp/queued.json"
"$shift_tool" --to standard >/dev/null

dom=$("$(dirname "$serve")/ftp-probe" --watch --count 1 | jq -r '.domains[] | select(.state=="serving") | .id')
"$drain" --domain "$dom" 2>"$tmp/err"; rc=$?
check "drain last domain: refused, exit 1" test $rc -eq 1
check "drain last domain: named" grep -q "ftp.LastDomain" "$tmp/err"
"$drain" --domain d999 2>"$tmp/err"; rc=$?
check "drain unknown domain: exit 2" test $rc -eq 2
# Draining every serving domain at once is refused before any drains.
"$shift_tool" --to replicated >/dev/null
"$drain" --devices vd2-3 2>"$tmp/err"; rc=$?
check "drain of every serving domain: refused, exit 1" test $rc -eq 1
check "drain of every serving domain: named" grep -q "ftp.LastDomain" "$tmp/err"
check "drain of every serving domain: none drained" test "$("$(dirname "$serve")/ftp-probe" --watch --count 1 | jq '[.domains[] | select(.state=="serving")] | length')" = 2
"$shift_tool" --to standard >/dev/null

printf '%s\n' '{"kind":"ftp.decision/v1","t_ms":1,"action":"hold","from":"standard","policy":"test"}' \
  'not json' \
  '{"kind":"ftp.decision/v1","t_ms":2,"action":"shift","from":"standard","to":"pipelined","policy":"test","reason":"burst"}' \
  | "$shift_tool" --from-stdin --json=short >"$tmp/dec.jsonl" 2>"$tmp/err"; rc=$?
check "from-stdin: bad line warned" grep -q "stdin:2:" "$tmp/err"
check "from-stdin: shift executed" jq -se '.[0].to=="pipelined" and .[0].outcome=="committed" and .[0].trigger=="policy:test"' "$tmp/dec.jsonl"
check "from-stdin: exit 2 for the skipped line" test $rc -eq 2
# A decision's own ramp (the gear shifter's urgent path) replaces the daemon's 10 %, 50 %, 100 %.
printf '%s\n' '{"kind":"ftp.decision/v1","t_ms":3,"action":"shift","from":"pipelined","to":"standard","policy":"test","ramp":[0.5,1.0],"ramp_step_ms":50}' \
  | "$shift_tool" --from-stdin --follow --json=short >"$tmp/ramp.jsonl" 2>"$tmp/err"; rc=$?
check "from-stdin: a decision's own ramp, exit 0" test $rc -eq 0
check "from-stdin: the shift ramps 50 %, 100 % as the decision says" \
  jq -se '[.[] | select(.phase=="ramp") | .traffic_share] == [0.5, 1] and (map(select(.outcome)) | .[0].outcome) == "committed"' "$tmp/ramp.jsonl"

status=$(curl -s -o /dev/null -w '%{http_code}' "http://127.0.0.1:$port/v1/completions" -H "Content-Type: application/json" -d '{"prompt": ')
check "malformed body: 400" test "$status" = 400
check "metrics: shifts by outcome" bash -c "curl -s http://127.0.0.1:$port/metrics | grep -q 'flextp:shifts_total{model_name=\"[^\"]*\",outcome=\"rolled-back\",trigger=\"[^\"]*\"} 1'"

# A client killed mid-stream affects no other request.
curl -sN "http://127.0.0.1:$port/v1/completions" -H "Content-Type: application/json" -d '{"prompt":"Once","max_tokens":400,"stream":true}' >/dev/null &
victim=$!
sleep 0.2; kill -9 $victim 2>/dev/null; wait $victim 2>/dev/null
check "after a killed client: golden text" test "$(complete Zoo 57 | jq -r '.choices[0].text')" = "$golden"

# 16 streaming clients through 20 shifts: tests/tools/shift-soak.sh.

# SIGTERM in the middle of a shift: every in-flight request completes, exit 0.
kill -TERM $daemon; wait $daemon; daemon=
start_daemon 400
for i in 1 2 3 4; do
  curl -sN "http://127.0.0.1:$port/v1/completions" -H "Content-Type: application/json" -d '{"prompt":"Zoo","max_tokens":300,"stream":true,"temperature":0}' >"$tmp/stream$i" &
done
"$shift_tool" --to performance --follow >"$tmp/mid.jsonl" 2>/dev/null &
shifter=$!
for _ in $(seq 1 100); do grep -q '"phase":"ramp"' "$tmp/mid.jsonl" 2>/dev/null && break; sleep 0.05; done
kill -TERM $daemon; wait $daemon; rc=$?; daemon=
wait $shifter
wait
check "SIGTERM mid-shift: exit 0" test $rc -eq 0
for i in 1 2 3 4; do
  check "SIGTERM mid-shift: stream $i finished" grep -q '\[DONE\]' "$tmp/stream$i"
  check "SIGTERM mid-shift: stream $i not failed" bash -c "! grep -q '\"error\"' $tmp/stream$i"
done
"$shift_tool" --to economy 2>"$tmp/err"; rc=$?
check "daemon gone: exit 3" test $rc -eq 3

finish
