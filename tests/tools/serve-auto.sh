#!/bin/bash
# The control loop against a live ftp-serve on CPU virtual devices: a load
# burst shifts up, quiet after it shifts back down, and the shift records
# name the policy as trigger; once with ftp-serve --auto, once with the shell
# pipeline shell/ftp-loop (ftp-probe --watch | ftp-plan decide | ftp-shift).
# Fixtures: hand-set capacities and a fast policy (seconds, not minutes).
set -u
tools=$1; src=$2
gears=$src/examples/gears/stories260K-cpu-measured.json
policy=$src/tests/tools/fixtures/fast-policy.json
source "$(dirname "$0")/common.sh"
need_stories260k
tmp=$(mktemp -d)
export FTP_SOCKET=$tmp/control.sock
export STATE_DIRECTORY=$tmp/state  # the shift journal, not /var/lib/flextp
daemon=; loop=; burst=()
cleanup() {
  kill "${burst[@]}" $loop 2>/dev/null; [ -n "$daemon" ] && kill -9 $daemon 2>/dev/null
  rm -rf "$tmp"
}
trap cleanup EXIT

start_daemon() {
  start_daemon_with "$tools/ftp-serve" "$tmp/serve.log" -m "$m" --gears "$gears" --max-running 2 --step-interval-ms 50 "$@"
}
gear_now() { "$tools/ftp-probe" --watch --count 1 | jq -r .gear; }
wait_gear() {  # GEAR SECONDS
  for _ in $(seq 1 $(($2 * 10))); do [ "$(gear_now)" = "$1" ] && return 0; sleep 0.1; done
  return 1
}
run_burst() {  # SECONDS
  burst=()
  for i in $(seq 1 8); do
    ( end=$((SECONDS + $1)); while [ $SECONDS -lt $end ]; do
        curl -s "http://127.0.0.1:$port/v1/completions" -H "Content-Type: application/json" -d '{"prompt":"Zoo","max_tokens":24}' >/dev/null
      done ) &
    burst+=($!)
  done
}

# 1. ftp-serve --auto (on a copy of the table, replaced below)
live=$tmp/gears.json
cp "$gears" "$live"
start_daemon_with "$tools/ftp-serve" "$tmp/serve.log" -m "$m" --gears "$live" --max-running 2 --step-interval-ms 50 \
  --virtual-devices 4 --auto --policy "$policy" --observe-interval-ms 200
run_burst 8
check "auto: up-shift during the burst" wait_gear standard 8
wait "${burst[@]}" 2>/dev/null; burst=()
check "auto: down-shift after it" wait_gear economy 15
check "auto: log shows the policy's decisions" grep -q "auto: decision shift economy -> standard" "$tmp/serve.log"
kill -HUP $daemon
for _ in $(seq 1 30); do grep -q "auto: gear table reloaded" "$tmp/serve.log" && break; sleep 0.1; done
check "auto: SIGHUP reloads the table, the policy starts over on it" grep -q "auto: gear table reloaded" "$tmp/serve.log"
# A table the policy cannot run on (no capacities) is refused; the loop goes on.
cp "$src/examples/gears/stories260K-cpu.json" "$live"
kill -HUP $daemon
for _ in $(seq 1 30); do grep -q "SIGHUP: reload refused" "$tmp/serve.log" && break; sleep 0.1; done
check "auto: a table without capacities is refused at reload" grep -q "SIGHUP: reload refused.*no measured or estimated capacity" "$tmp/serve.log"
check "auto: the daemon still answers" test "$(gear_now)" = economy
kill -TERM $daemon; wait $daemon; rc=$?; daemon=
check "auto: exit 0 after SIGTERM" test $rc -eq 0

# 2. The shell pipeline
start_daemon
FTP_BUILD=$tools/.. FTP_WATCH_INTERVAL_MS=200 "$src/shell/ftp-loop" "$gears" "$policy" >"$tmp/loop.jsonl" 2>"$tmp/loop.err" &
loop=$!
run_burst 8
check "pipeline: up-shift during the burst" wait_gear standard 8
wait "${burst[@]}" 2>/dev/null; burst=()
check "pipeline: down-shift after it" wait_gear economy 15
kill $loop 2>/dev/null; pkill -f "ftp-probe --watch --interval 200" 2>/dev/null; loop=
check "pipeline: records name the trigger" \
  jq -se '[.[] | select(.phase=="done")] | (.[0].trigger=="policy:gear-shifter" and .[0].to=="standard" and .[1].to=="economy")' "$tmp/loop.jsonl"
kill -TERM $daemon; wait $daemon; daemon=

finish
