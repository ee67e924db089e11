#!/bin/bash
# The shift soak (issue 20, "same behaviour"): 16 streaming clients stay
# busy while ftp-shift walks the stories260K gear table SHIFTS times
# (TP 1 <-> 2 <-> 4, PP 1 <-> 2, replicas). Every greedy completion must be
# llama.cpp's golden text (wrong: 0) and every request must end in 200 with
# [DONE] and no error event (failed: 0), counted both by the clients and by
# the daemon's flextp:requests_failed_total.
#   shift-soak.sh SERVE SHIFT SRC [SHIFTS]      (default 100; CI runs 20)
# Prints one line of JSON with the counts (docs/benchmarks.md, "shift soak").
set -u
serve=$1; shift_tool=$2; src=$3; shifts=${4:-100}
source "$(dirname "$0")/common.sh"
need_stories260k
daemon_sandbox
golden=$(tail -c +4 "$data/models/stories260K/golden_greedy_t0_prompt_Zoo_steps60.txt")

start_daemon_with "$serve" "$tmp/serve.log" -m "$m" --gears "$src/examples/gears/stories260K-cpu.json" \
  --step-interval-ms 100

# One curl per request (no parsing while the load runs): on two cores the
# clients run at nice 10 so that they do not starve the domains.
mkdir -p "$tmp/clients"
clients=()
for c in $(seq 1 16); do
  ( renice -n 10 -p $BASHPID >/dev/null; i=0; while [ ! -f "$tmp/stop" ]; do
      i=$((i+1))
      curl -sN -o "$tmp/clients/$c-$i.sse" -w '%{http_code}' "http://127.0.0.1:$port/v1/completions" \
        -H "Content-Type: application/json" \
        -d '{"prompt":"Zoo","max_tokens":57,"temperature":0,"stream":true}' >"$tmp/clients/$c-$i.code"
      echo $? >"$tmp/clients/$c-$i.rc"
    done ) &
  clients+=($!)
done
cycle=(standard performance standard economy pipelined replicated economy)
committed=0; t0=$(date +%s%N)
for s in $(seq 0 $((shifts - 1))); do
  "$shift_tool" --to "${cycle[$((s % ${#cycle[@]}))]}" --step-interval 20 --queue >"$tmp/shift.json" 2>>"$tmp/shift.err" &&
    committed=$((committed+1))
done
wall=$(( ($(date +%s%N) - t0) / 1000000 ))
touch "$tmp/stop"; wait "${clients[@]}" 2>/dev/null

n=0; failed=0; wrong=0
for f in "$tmp"/clients/*.rc; do
  b=${f%.rc}; n=$((n+1))
  if [ "$(cat "$f")" != 0 ] || [ "$(cat "$b.code")" != 200 ] || ! grep -q '^data: \[DONE\]' "$b.sse" ||
     grep -q '"error"' "$b.sse"; then
    failed=$((failed+1)); continue
  fi
  text=$(sed -n 's/^data: //p' "$b.sse" | grep -v '^\[DONE\]' | jq -j '.choices[0].text')
  [ "$text" = "$golden" ] || wrong=$((wrong+1))
done
metrics=$(curl -s "http://127.0.0.1:$port/metrics")
daemon_failed=$(sed -n 's/^flextp:requests_failed_total[{][^}]*[}] //p' <<<"$metrics")
echo "{\"shifts\":$shifts,\"committed\":$committed,\"wall_ms\":$wall,\"requests\":$n,\"failed\":$failed,\"wrong\":$wrong,\"daemon_failed\":${daemon_failed:-null}}"

check "$shifts shifts under 16 streaming clients: all committed ($committed)" test "$committed" -eq "$shifts"
check "16 clients: completions streamed ($n)" test "$n" -gt 16
check "16 clients: no failed request ($failed)" test "$failed" -eq 0
check "16 clients: every completion is the golden text ($wrong differ)" test "$wrong" -eq 0
check "daemon: flextp:requests_failed_total 0 (${daemon_failed:-missing})" test "${daemon_failed:-x}" = 0
kill -TERM $daemon; wait $daemon; rc=$?; daemon=
check "SIGTERM after the soak: exit 0" test $rc -eq 0
finish
