#!/bin/bash
# The shift journal (issue 20, item 5): kill -9 during a shift, restart,
# and `ftp-shift --history` shows the interrupted shift and all earlier
# ones; the daemon's log names it; --since filters; shift ids go on.
set -u
serve=$1; shift_tool=$2; src=$3
source "$(dirname "$0")/common.sh"
need_stories260k
daemon_sandbox
state=$tmp/journal
start() {
  start_daemon_with "$serve" "$tmp/serve.log" -m "$m" --gears "$src/examples/gears/stories260K-cpu.json" \
    --state-dir "$state" --step-interval-ms 100
}

start
"$shift_tool" --to standard >/dev/null; check "shift 1: committed" test $? -eq 0
"$shift_tool" --to economy >/dev/null; check "shift 2: committed" test $? -eq 0
# A third shift with long ramp steps, killed in its ramp.
"$shift_tool" --to pipelined --step-interval 5000 --follow >"$tmp/third.jsonl" 2>/dev/null &
client=$!
for _ in $(seq 1 200); do grep -q '"phase":"ramp"' "$tmp/third.jsonl" 2>/dev/null && break; sleep 0.05; done
check "shift 3: reached its ramp" grep -q '"phase":"ramp"' "$tmp/third.jsonl"
kill -9 "$daemon"; wait "$daemon" 2>/dev/null; wait "$client" 2>/dev/null
check "journal: no done for shift 3 before the restart" \
  test "$(jq -c 'select(.shift_id=="shift-3" and .phase=="done")' "$state/shifts.jsonl" | wc -l)" -eq 0

start
check "restart: the log names the interrupted shift" grep -q "shift journal: shift-3 was interrupted" "$tmp/serve.log"
"$shift_tool" --history >"$tmp/history.jsonl"; rc=$?
check "history: exit 0" test $rc -eq 0
check "history: three records" test "$(wc -l <"$tmp/history.jsonl")" -eq 3
check "history: ids and outcomes" test "$(jq -r '.shift_id + "=" + .outcome' "$tmp/history.jsonl" | tr '\n' ' ')" = \
  "shift-1=committed shift-2=committed shift-3=interrupted "
check "history: the interrupted one names its phase" jq -se '.[2].message | test("during phase ramp")' "$tmp/history.jsonl"
check "history: each has a time" jq -se 'all(.[]; .time | test("^[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9:.]+Z$"))' "$tmp/history.jsonl"
# Shift ids go on after the journal's last.
"$shift_tool" --to standard >"$tmp/fourth.json"; check "shift 4: committed" test $? -eq 0
check "shift 4: its id follows the journal's" jq -e '.shift_id=="shift-4"' "$tmp/fourth.json"
check "history: four after a new shift" test "$("$shift_tool" --history | wc -l)" -eq 4
since=$(jq -r .time "$tmp/fourth.json" 2>/dev/null)
[ "$since" = null ] && since=$("$shift_tool" --history | tail -1 | jq -r .time)
check "--since: only the records from then" test "$("$shift_tool" --history --since "$since" | jq -r .shift_id)" = shift-4
"$shift_tool" --history --since yesterday 2>"$tmp/err"; rc=$?
check "--since: a bad time exits 2" test $rc -eq 2
check "--since: a bad time is named" grep -qF 'expected an ISO 8601 UTC time' "$tmp/err"
finish
