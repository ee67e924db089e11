#!/bin/bash
# ftp-serve --engine sim: a 70 B model (model-shape JSON, no weights) on the
# described 8 x A100 node, planned by ftp-plan. Completions (plain and
# streamed), a shift with ftp-shift, observations, drain on SIGTERM, exactly
# as with the real engine; named errors for a bad engine and missing speeds.
set -u
tools=$1; src=$2
source "$(dirname "$0")/common.sh"
daemon_sandbox
model=$src/examples/models/llama-70b.json
cluster=$src/examples/clusters/a100-8x-nvlink.json

"$tools/ftp-serve" --engine turbo -m "$model" --port 0 2>"$tmp/err"; rc=$?
check "unknown engine: exit 2" test $rc -eq 2
check "unknown engine: named" grep -q 'unknown engine "turbo"' "$tmp/err"
"$tools/ftp-serve" --engine sim -m "$model" -p Hi 2>"$tmp/err"; rc=$?
check "one-shot with the simulated engine: exit 2" test $rc -eq 2
check "one-shot with the simulated engine: says why" grep -q "one-shot runs the real engine only" "$tmp/err"
jq 'del(.nodes[0].devices[0].tflop_s)' "$cluster" >"$tmp/no-speed.json"
"$tools/ftp-serve" --engine sim -m "$model" --topology "$tmp/no-speed.json" --gear tp=8 --port 0 2>"$tmp/err"; rc=$?
check "cluster spec without tflop_s: exit 2" test $rc -eq 2
check "cluster spec without tflop_s: names file and field" grep -qF 'no-speed.json: nodes[0].devices[0].tflop_s: missing' "$tmp/err"
"$tools/ftp-probe" --cluster "$cluster" >"$tmp/topo.json"
jq '(.devices[] | select(.id == "n0.gpu3") | .gemm_tflop_s) = 0' "$tmp/topo.json" >"$tmp/zero-speed.json"
"$tools/ftp-serve" --engine sim -m "$model" --topology "$tmp/zero-speed.json" --gear tp=8 --port 0 2>"$tmp/err"; rc=$?
check "topology with gemm_tflop_s 0: exit 2" test $rc -eq 2
check "topology with gemm_tflop_s 0: names device and field" grep -q 'n0.gpu3: gemm_tflop_s is missing or 0' "$tmp/err"
"$tools/ftp-serve" --engine sim -m "$model" --topology "$tmp/topo.json" --gear tp=8,dp=2 --port 0 2>"$tmp/err"; rc=$?
check "gear larger than the topology: exit 2" test $rc -eq 2
check "gear larger than the topology: named" grep -q 'needs 16 devices, the topology has 8' "$tmp/err"

"$tools/ftp-plan" --topology "$tmp/topo.json" --model "$model" >"$tmp/gears.json"
check "ftp-plan: a table for the 70 B model" jq -e '.gears | length >= 2' "$tmp/gears.json"
start_daemon_with "$tools/ftp-serve" "$tmp/serve.log" --engine sim -m "$model" --topology "$cluster" \
  --gears "$tmp/gears.json" --step-interval-ms 100
check "log names the simulated engine" grep -q "engine: simulated" "$tmp/serve.log"

complete() { curl -s "http://127.0.0.1:$port/v1/completions" -H "Content-Type: application/json" -d "{\"prompt\":\"$1\",\"max_tokens\":$2}"; }
t0=$(date +%s.%N)
complete "The cluster" 16 >"$tmp/c1.json"
t1=$(date +%s.%N)
check "completion: 16 tokens, length" jq -e '.usage.completion_tokens == 16 and .choices[0].finish_reason == "length"' "$tmp/c1.json"
check "completion: stand-in text (letters and spaces)" jq -e '.choices[0].text | test("^[a-z ]{16}$")' "$tmp/c1.json"
check "completion: prompt counted by the byte-level stand-in (BOS + 11 bytes)" jq -e '.usage.prompt_tokens == 12' "$tmp/c1.json"
check "completion: deterministic" test "$(complete "The cluster" 16 | jq -r '.choices[0].text')" = "$(jq -r '.choices[0].text' "$tmp/c1.json")"
# Paced in real time: 16 decode steps of a 70 B model on TP2 A100s read
# ~70 GB per rank per step, > 40 ms each at 2039 GB/s x 0.7.
check "completion: takes the simulated cluster's time (> 0.6 s)" awk -v a="$t0" -v b="$t1" 'BEGIN { exit !(b - a > 0.6) }'
curl -sN "http://127.0.0.1:$port/v1/completions" -H "Content-Type: application/json" -d '{"prompt":"Hi","max_tokens":5,"stream":true}' >"$tmp/stream.txt"
check "stream: 5 token events and [DONE]" test "$(grep -c '"text"' "$tmp/stream.txt")" -ge 5 -a "$(grep -c '\[DONE\]' "$tmp/stream.txt")" -eq 1
curl -s "http://127.0.0.1:$port/v1/completions" -H "Content-Type: application/json" -d '{"prompt":"x","max_tokens":99999}' >"$tmp/bad.json"
check "bad request: named field" jq -e '.error.param == "max_tokens"' "$tmp/bad.json"

first=$(jq -r '.gears[0].name' "$tmp/gears.json"); second=$(jq -r '.gears[1].name' "$tmp/gears.json")
load=()
for i in 1 2 3 4; do complete "load $i" 24 >"$tmp/load$i.json" & load+=($!); done
"$tools/ftp-shift" --to "$second" --follow >"$tmp/shift.jsonl"; rc=$?
wait "${load[@]}"
check "shift under load: exit 0" test $rc -eq 0
check "shift: the requests in flight finished" jq -se 'map(.usage.completion_tokens) == [24,24,24,24]' "$tmp"/load?.json
check "shift: committed $first -> $second" jq -se ".[-1].outcome==\"committed\" and .[-1].from==\"$first\" and .[-1].to==\"$second\"" "$tmp/shift.jsonl"
"$tools/ftp-probe" --watch --count 1 >"$tmp/obs.json"
check "observation: new gear, its devices busy" jq -e ".gear == \"$second\" and (.domains | length) == $(jq ".gears[1].dp" "$tmp/gears.json")" "$tmp/obs.json"
check "after shift: same text" test "$(complete "The cluster" 16 | jq -r '.choices[0].text')" = "$(jq -r '.choices[0].text' "$tmp/c1.json")"
curl -s "http://127.0.0.1:$port/metrics" >"$tmp/metrics.txt"
check "metrics: TTFT histogram counts the requests" grep -qE '^vllm:time_to_first_token_seconds_count[{][^}]*[}] [1-9]' "$tmp/metrics.txt"

complete "drain me" 40 >"$tmp/last.json" &
last=$!
sleep 0.3
kill -TERM $daemon; wait $daemon; rc=$?; daemon=
wait $last
check "SIGTERM: exit 0" test $rc -eq 0
check "SIGTERM: the in-flight request finished" jq -e '.usage.completion_tokens == 40' "$tmp/last.json"
finish
