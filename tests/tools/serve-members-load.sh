#!/bin/bash
# Shifts under load across processes (issue 16): a leader and two members
# on loopback (examples/clusters/two-machines-loopback), STREAMS streaming
# clients asking greedy completions in a loop while SHIFTS shifts cycle
# between the in-process gear and the cross-process ones. Every request
# must succeed and every answer equal the golden text of one process.
# Defaults 20 shifts, 16 streams (the issue's); CI passes fewer (meson.build).
set -u
serve=$1; shift_tool=$2; src=$3
shifts=${4:-20}; streams=${5:-16}
source "$(dirname "$0")/common.sh"
need_stories260k
daemon_sandbox
pids=()
trap '[ -n "$daemon" ] && kill -9 "$daemon" 2>/dev/null; for p in "${pids[@]}"; do kill -9 "$p" 2>/dev/null; done; rm -rf "$tmp"' EXIT
gears=$src/examples/clusters/two-machines-loopback/gears.json
(umask 077; echo "loopback-load-secret-0123456789" >"$tmp/secret")
start_daemon_with "$serve" "$tmp/serve.log" -m "$m" --gears "$gears" --virtual-devices 2 \
  --members-listen 127.0.0.1:0 --secret-file "$tmp/secret" --step-interval-ms 100 --max-running 32
mport=$(sed -n 's/.*member channel on 127.0.0.1:\([0-9]*\).*/\1/p' "$tmp/serve.log")
for n in n1 n2; do
  "$serve" -m "$m" --join "127.0.0.1:$mport" --secret-file "$tmp/secret" --name $n --virtual-devices 2 2>>"$tmp/$n.log" &
  pids+=($!)
done
for _ in $(seq 1 300); do grep -q "member n2 joined" "$tmp/serve.log" && grep -q "member n1 joined" "$tmp/serve.log" && break; sleep 0.1; done
golden=$(tail -c +4 "$data/models/stories260K/golden_greedy_t0_prompt_Zoo_steps60.txt")
printf '%s' "$golden" >"$tmp/golden"

client() {  # ID: streams completions until $tmp/stop exists; one line per answer
  while [ ! -e "$tmp/stop" ]; do
    curl -sN "http://127.0.0.1:$port/v1/completions" -H "Content-Type: application/json" \
      -d '{"prompt":"Zoo","max_tokens":57,"temperature":0,"stream":true}' >"$tmp/c$1.sse"
    text=$(sed -n 's/^data: //p' "$tmp/c$1.sse" | grep -v '^\[DONE\]' | jq -j '.choices[0].text // empty' 2>/dev/null)
    if [ "$text" = "$(cat "$tmp/golden")" ] && grep -q '^data: \[DONE\]' "$tmp/c$1.sse"; then echo ok; else echo "bad: $(head -c 300 "$tmp/c$1.sse")"; fi
  done >"$tmp/client$1.out"
}
clients=()
for i in $(seq 1 "$streams"); do client "$i" & clients+=($!); done

cycle=(tp2-across local pp2-across local tp2-pp2-over-three local)
committed=0
for i in $(seq 0 $((shifts - 1))); do
  g=${cycle[$((i % ${#cycle[@]}))]}
  "$shift_tool" --to "$g" >"$tmp/shift$i.json" 2>&1
  jq -e '.outcome=="committed"' "$tmp/shift$i.json" >/dev/null 2>&1 && committed=$((committed + 1))
done
touch "$tmp/stop"
wait "${clients[@]}"
answers=$(cat "$tmp"/client*.out | wc -l)
bad=$(cat "$tmp"/client*.out | grep -vc '^ok$')
echo "shifts committed: $committed of $shifts; answers: $answers, failed or different: $bad"
check "$shifts shifts under $streams streams: all committed" test "$committed" -eq "$shifts"
check "every answer equals the one-process golden text ($answers answers)" test "$bad" -eq 0
check "answers were served" test "$answers" -ge "$streams"
[ "$bad" -eq 0 ] || grep -h -v '^ok$' "$tmp"/client*.out | head -3
finish
