#!/bin/bash
# ftp-serve --engine sim on a described cluster where one device is 10000 x
# slower than the others, so that a gear on it is really slower (the cost
# model paces its steps in real time; no fault injected):
# - a shift to the slow gear under load rolls back on its P99 E2E against
#   the baseline, ftp-shift exits 6, no request fails;
# - a request on a draining domain keeps it draining through the next shift,
#   ends with its full text, and only then is the domain retired;
# - ftp-drain waits for the request on the domain it drains;
# - SIGTERM waits for the request in flight, which ends with its full text.
set -u
tools=$1; src=$2
source "$(dirname "$0")/common.sh"
daemon_sandbox
model=$src/examples/models/stories260K.json

# Two fast devices (A100-like) and a slow one: a decode step of stories260K
# (1 MB of weights) takes about 150 ms there, against microseconds.
cat >"$tmp/cluster.json" <<'EOF'
{
  "kind": "ftp.cluster/v1",
  "name": "fast-and-slow",
  "comment": "Test cluster of tests/tools/serve-slow-gear.sh: two fast devices, one 10000 x slower.",
  "nodes": [
    {"id": "n0", "cpu_cores": 8, "memory_gib": 64,
     "devices": [
       {"id": "fast", "count": 2, "type": "gpu", "name": "fast", "memory_gib": 40,
        "tflop_s": 300, "dtype": "f32", "memory_bandwidth_gb_s": 1500},
       {"id": "slow", "type": "gpu", "name": "slow", "memory_gib": 40,
        "tflop_s": 0.0025, "dtype": "f32", "memory_bandwidth_gb_s": 0.01}
     ]}
  ],
  "fabrics": [{"id": "link", "type": "nvlink", "nodes": ["n0"], "bandwidth_gb_s": 200, "latency_us": 2}]
}
EOF
stage() { echo "{\"stages\": [{\"layers\": [0, 5], \"devices\": [\"$1\"]}]}"; }
cat >"$tmp/gears.json" <<EOF
{
  "kind": "ftp.gear-table/v1",
  "model": {"name": "stories260K", "n_layers": 5, "n_heads": 8, "n_kv_heads": 4, "hidden_size": 64},
  "topology": "fast-and-slow",
  "gears": [
    {"name": "fast", "tp": 1, "pp": 1, "dp": 1, "replicas": [$(stage n0.fast0)]},
    {"name": "slow", "tp": 1, "pp": 1, "dp": 1, "replicas": [$(stage n0.slow)]},
    {"name": "fast2", "tp": 1, "pp": 1, "dp": 1, "replicas": [$(stage n0.fast1)]},
    {"name": "mixed", "tp": 1, "pp": 1, "dp": 2, "replicas": [$(stage n0.slow), $(stage n0.fast1)]}
  ]
}
EOF

start_daemon_with "$tools/ftp-serve" "$tmp/serve.log" --engine sim -m "$model" --topology "$tmp/cluster.json" \
  --gears "$tmp/gears.json" --step-interval-ms 100 --drain-timeout-ms 300
complete() { curl -s "http://127.0.0.1:$port/v1/completions" -H "Content-Type: application/json" -d "{\"prompt\":\"$1\",\"max_tokens\":$2}"; }
watch() { "$tools/ftp-probe" --watch --count 1; }
# state_of GEAR: the states of that gear's domains, space-separated.
state_of() { watch | jq -r --arg g "$1" '[.domains[] | select(.gear == $g) | .state] | join(" ")'; }

# ---- A shift to the slow gear under load rolls back on P99.
mkdir -p "$tmp/load"
clients=()
for c in $(seq 1 8); do
  ( i=0; while [ ! -f "$tmp/stop" ]; do i=$((i+1)); complete "client $c" 4 >"$tmp/load/$c-$i.json"; done ) &
  clients+=($!)
done
# A baseline first: completions on the fast gear.
for _ in $(seq 1 200); do [ "$(ls "$tmp/load" | wc -l)" -ge 60 ] && break; sleep 0.05; done
# Half the traffic on the slow gear for 6 s: the check needs 20 samples
# there (8 clients, under a second per request).
"$tools/ftp-shift" --to slow --ramp 0.5,1 --step-interval 6000 >"$tmp/rb.json"; rc=$?
touch "$tmp/stop"; wait "${clients[@]}"; rm -f "$tmp/stop"
check "slower gear: ftp-shift exits 6" test $rc -eq 6
check "slower gear: rolled back" jq -e '.outcome == "rolled-back" and .from == "fast" and .to == "slow"' "$tmp/rb.json"
check "slower gear: the reason is P99 E2E against the baseline" \
  jq -e '.message | test("^P99 E2E [0-9.]+ ms > 1.5 x baseline [0-9.]+ ms$")' "$tmp/rb.json"
check "slower gear: P99 after above P99 before" jq -e '.after_e2e_ms.p99 > .before_e2e_ms.p99' "$tmp/rb.json"
check "slower gear: still on the fast gear" test "$(state_of fast)" = serving
# The rollback waits the drain timeout (300 ms) for the slow shadow's
# requests; one still running keeps it draining, without traffic.
check "slower gear: the slow domain takes no new requests" bash -c "[[ '$(state_of slow)' =~ ^(draining)?$ ]]"
n=$(ls "$tmp/load" | wc -l)
check "slower gear: every completion under load has its 4 tokens ($n)" \
  jq -se 'length > 60 and all(.[]; .usage.completion_tokens == 4 and .choices[0].finish_reason == "length")' "$tmp"/load/*.json
check "slower gear: no failed request" bash -c "curl -s http://127.0.0.1:$port/metrics | grep -qE '^flextp:requests_failed_total[{][^}]*[}] 0$'"

# The full text of the long request, done alone.
full=$(complete "the long one" 50 | jq -r '.choices[0].text')
check "reference: 50 characters of stand-in text" test ${#full} -eq 50

# ---- A domain holding a request stays draining through the next shift.
"$tools/ftp-shift" --to slow >/dev/null
check "retire: on the slow gear" test "$(state_of slow)" = serving
complete "the long one" 50 >"$tmp/long.json" &   # 50 steps of ~150 ms
long=$!
sleep 0.5
# The drain timeout (300 ms) passes: the shift commits, the old domain drains on.
"$tools/ftp-shift" --to fast --json=short >"$tmp/s1.json"; rc=$?
check "retire: first shift commits" test $rc -eq 0
check "retire: first shift says the old domain still drains" jq -e '.message | test("shifted slow -> fast")' "$tmp/s1.json"
check "retire: the slow domain drains" test "$(state_of slow)" = draining
"$tools/ftp-shift" --to fast2 >/dev/null; rc=$?
check "retire: second shift commits while the request runs" test $rc -eq 0
check "retire: the request is still running after the second shift" kill -0 $long
check "retire: the slow domain still drains after the second shift" test "$(state_of slow)" = draining
wait $long
check "retire: the request finished with its full text" \
  jq -e --arg t "$full" '.usage.completion_tokens == 50 and .choices[0].finish_reason == "length" and .choices[0].text == $t' "$tmp/long.json"
"$tools/ftp-shift" --to fast >/dev/null
check "retire: idle, the slow domain is retired at the next shift" test -z "$(state_of slow)"

# ---- ftp-drain waits for the request on the domain it drains.
"$tools/ftp-shift" --to mixed >/dev/null   # replicas on n0.slow and n0.fast1
complete "the long one" 50 >"$tmp/d1.json" &   # one on each replica
d1=$!
complete "the long one" 50 >"$tmp/d2.json" &
d2=$!
sleep 0.5
"$tools/ftp-drain" --devices n0.slow --follow >"$tmp/drain.jsonl" &
drainer=$!
for _ in $(seq 1 100); do grep -q draining "$tmp/drain.jsonl" 2>/dev/null && break; sleep 0.05; done
check "drain: the domain on n0.slow drains while its request runs" \
  bash -c "'$tools/ftp-probe' --watch --count 1 | jq -e '[.domains[] | select(.devices == [\"n0.slow\"]) | .state] == [\"draining\"]'"
check "drain: ftp-drain waits for it" kill -0 $drainer
wait $drainer; rc=$?
wait $d1 $d2
check "drain: exit 0" test $rc -eq 0
check "drain: retired after it waited for one request" \
  jq -se 'any(.[]; .state == "draining" and .inflight == 1) and any(.[]; .state == "retired") and .[-1].waited == 1' \
  "$tmp/drain.jsonl"
check "drain: both requests finished with their full text" \
  jq -se --arg t "$full" 'all(.[]; .usage.completion_tokens == 50 and .choices[0].text == $t)' "$tmp/d1.json" "$tmp/d2.json"
check "drain: only the fast replica is left" test "$(watch | jq -c '[.domains[].devices[]]')" = '["n0.fast1"]'

# ---- SIGTERM waits for the request in flight (the drain timeout is SIGTERM's too: a longer one).
kill -TERM $daemon; wait $daemon; daemon=
start_daemon_with "$tools/ftp-serve" "$tmp/serve2.log" --engine sim -m "$model" --topology "$tmp/cluster.json" \
  --gears "$tmp/gears.json" --start-gear slow --drain-timeout-ms 60000
complete "the long one" 50 >"$tmp/last.json" &
last=$!
sleep 0.5
kill -TERM $daemon
check "SIGTERM: the daemon waits while the request runs" kill -0 $daemon
wait $daemon; rc=$?; daemon=
wait $last
check "SIGTERM: exit 0" test $rc -eq 0
check "SIGTERM: the request in flight finished with its full text" \
  jq -e --arg t "$full" '.usage.completion_tokens == 50 and .choices[0].text == $t' "$tmp/last.json"
finish
