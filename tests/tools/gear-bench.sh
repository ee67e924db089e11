#!/bin/bash
# ftp-gear-bench against a private ftp-serve on stories260K: a fixed-rate run,
# a sweep that writes capacity into a copy of the gear table, --shift, the
# --min-throughput gate (exit 6), an unreachable daemon (exit 3), usage errors.
set -u
bin=$1; src=$2
bench=$bin/ftp-gear-bench
source "$(dirname "$0")/common.sh"
need_stories260k
tmp=$(mktemp -d)
export FTP_SOCKET=$tmp/control.sock
export STATE_DIRECTORY=$tmp/state  # the shift journal, not /var/lib/flextp
daemon=
cleanup() { [ -n "$daemon" ] && { kill -TERM "$daemon"; wait "$daemon"; } 2>/dev/null; rm -rf "$tmp"; }
trap cleanup EXIT

start_daemon_with "$bin/ftp-serve" "$tmp/serve.log" -m "$m" --gears "$src/examples/gears/stories260K-cpu.json"
url=http://127.0.0.1:$port

# A fixed rate for 2 s, with raw samples.
"$bench" --url "$url" --gear economy --rate 10 --duration 2s --prompt-tokens 16 --output-tokens 24 \
  --slo-ttft-ms 1000 --slo-tpot-ms 100 --samples "$tmp/s.jsonl" --json=short >"$tmp/one.json"; rc=$?
check "fixed rate: exit 0" test $rc -eq 0
check "fixed rate: kind" jq -e '.kind=="ftp.gear-bench/v1" and .gear=="economy" and (.runs|length)==1' "$tmp/one.json"
check "fixed rate: all completed" jq -e '.runs[0] | .requests > 5 and .completed == .requests and .failed == 0' "$tmp/one.json"
check "fixed rate: percentiles ordered" jq -e '[.runs[0] | .ttft_ms, .tpot_ms, .itl_ms, .e2e_ms | .p50 <= .p90 and .p90 <= .p99 and .p50 > 0] | all' "$tmp/one.json"
check "fixed rate: TTFT <= E2E" jq -e '.runs[0] | .ttft_ms.p50 <= .e2e_ms.p50' "$tmp/one.json"
check "fixed rate: throughput > 0" jq -e '.runs[0] | .request_throughput > 0 and .output_throughput > 0' "$tmp/one.json"
check "fixed rate: goodput <= throughput" jq -e '.runs[0] | .goodput <= .request_throughput + 1e-9' "$tmp/one.json"
check "fixed rate: sustained, capacity" jq -e '.runs[0].sustainable and .capacity.source=="bench" and (.capacity.safe_rps - 0.8*.capacity.max_rps | fabs) < 1e-9' "$tmp/one.json"
check "samples: one line per request" test "$(wc -l <"$tmp/s.jsonl")" = "$(jq '.runs[0].requests' "$tmp/one.json")"
check "samples: fields" jq -se 'all(.ok and .ttft_ms > 0 and .e2e_ms >= .ttft_ms and .output_tokens > 0 and (.itl_ms|length) >= 0)' "$tmp/s.jsonl"
"$bench" --url "$url" --rate 10 --duration 2s --seed 3 --prompt-tokens 8 --output-tokens 4 --samples "$tmp/a.jsonl" >/dev/null
"$bench" --url "$url" --rate 10 --duration 2s --seed 3 --prompt-tokens 8 --output-tokens 4 --samples "$tmp/b.jsonl" >/dev/null
check "seeded arrivals repeat" test "$(jq -c .scheduled_s "$tmp/a.jsonl")" = "$(jq -c .scheduled_s "$tmp/b.jsonl")"

# A sweep that writes the measured capacity into a copy of the gear table.
cp "$src/examples/gears/stories260K-cpu.json" "$tmp/gears.json"
"$bench" --url "$url" --gear economy --sweep 5,20,40 --requests 30 --arrivals gamma --burstiness 2 \
  --prompt-tokens 16 --output-tokens 16 --gears "$tmp/gears.json" --write-capacity --json=short >"$tmp/sweep.json"; rc=$?
check "sweep: exit 0" test $rc -eq 0
check "sweep: runs in rate order" jq -e '[.runs[].offered_rps] == ([.runs[].offered_rps] | sort) and (.runs|length) >= 1' "$tmp/sweep.json"
check "sweep: gamma recorded" jq -e '.arrivals.process=="gamma" and .arrivals.burstiness==2' "$tmp/sweep.json"
# ftp-gear-bench(1): completions over the run less its median E2E, at most
# the offered rate, of the sustained run that shows the most.
check "sweep: capacity is the best sustained" jq -e '(.capacity.max_rps - ([.runs[] | select(.sustainable and .offered_rps > 0 and .completed > 1)
  | ([.offered_rps, .completed / (.duration_s - .e2e_ms.p50 / 1000)] | min)] | max) | fabs) < 1e-9' "$tmp/sweep.json"
check "write-capacity: measured in the table" jq -e '.gears[] | select(.name=="economy") | .measured.source=="bench" and .measured.max_rps > 0 and .measured.window_s > 0' "$tmp/gears.json"
check "write-capacity: other gears unchanged" jq -e '[.gears[] | select(.name!="economy") | .measured] | all(. == null)' "$tmp/gears.json"
# The daemon reads the written table as it reads any (a second daemon on a
# socket of its own, stopped at once).
FTP_SOCKET=$tmp/second.sock "$bin/ftp-serve" -m "$m" --gears "$tmp/gears.json" --port 0 2>"$tmp/second.log" &
second=$!
for _ in $(seq 1 200); do [ -S "$tmp/second.sock" ] && break; kill -0 "$second" 2>/dev/null || break; sleep 0.05; done
check "write-capacity: the daemon serves the table" test -S "$tmp/second.sock"
kill -TERM "$second" 2>/dev/null; wait "$second"

# Requests the server refuses make the bench a usage error, naming the
# server's answer; the report is still written.
"$bench" --url "$url" --requests 2 --rate 5 --prompt-tokens 8 --output-tokens 100000 --samples "$tmp/r.jsonl" \
  --json=short >"$tmp/refused.json" 2>"$tmp/err"; rc=$?
check "refused requests: exit 2" test $rc -eq 2
check "refused requests: the server's answer quoted" grep -qF "refused 2 request(s) as invalid; first: HTTP 400: max_tokens: 100000 is over this server's limit" "$tmp/err"
check "refused requests: report written" jq -e '.runs[0].failed == 2' "$tmp/refused.json"
"$bench" --url http://127.0.0.1:99999 --requests 2 >"$tmp/out" 2>"$tmp/err"; rc=$?
check "bad --url port: exit 2, named" test $rc -eq 2 -a -n "$(grep -F "port '99999' is not 1-65535" "$tmp/err")"
"$bench" --url "$url" --requests 2 --min-throughput nan >"$tmp/out" 2>"$tmp/err"; rc=$?
check "NaN gate: exit 2, named" test $rc -eq 2 -a -n "$(grep -F -- '--min-throughput: must be a finite number >= 0, got nan' "$tmp/err")"

# A Mooncake trace replayed: its send times and sizes (capped by --prompt-tokens).
printf '%s\n' '{"timestamp": 0, "input_length": 12, "output_length": 5}' '{"timestamp": 150, "input_length": 900, "output_length": 3}' \
  '{"timestamp": 400, "input_length": 4, "output_length": 9, "hash_ids": [1]}' >"$tmp/trace.jsonl"
"$bench" --url "$url" --trace "$tmp/trace.jsonl" --prompt-tokens 40 --samples "$tmp/t.jsonl" --json=short >"$tmp/trace.json"; rc=$?
check "trace: exit 0" test $rc -eq 0
check "trace: one run of 3" jq -e '.arrivals.process=="trace" and (.runs|length)==1 and .runs[0].completed==3' "$tmp/trace.json"
check "trace: send times" test "$(jq -c .scheduled_s "$tmp/t.jsonl" | tr '\n' ' ')" = "0 0.15 0.4 "
check "trace: sizes" jq -se '.[0].output_tokens <= 5 and .[1].prompt_tokens < 100 and .[2].output_tokens <= 9' "$tmp/t.jsonl"
"$bench" --url "$url" --trace "$tmp/trace.jsonl" --rate 2 >/dev/null 2>&1; rc=$?
check "--trace with --rate: exit 2" test $rc -eq 2

# --shift: the daemon moves to the gear first.
"$bench" --url "$url" --gear performance --shift --rate 10 --requests 5 --output-tokens 8 --json=short >"$tmp/perf.json"; rc=$?
check "--shift: exit 0" test $rc -eq 0
check "--shift: daemon in performance" bash -c "curl -s $url/metrics | grep -q 'gear=\"performance\"'"

# The gate, an unreachable daemon, usage errors.
"$bench" --url "$url" --rate 5 --requests 3 --output-tokens 4 --min-throughput 1e9 >"$tmp/gate.json" 2>"$tmp/err"; rc=$?
check "--min-throughput 1e9: exit 6" test $rc -eq 6
check "--min-throughput: report still printed" jq -e '.kind=="ftp.gear-bench/v1"' "$tmp/gate.json"
"$bench" --url http://127.0.0.1:1 --rate 1 --requests 1 >/dev/null 2>"$tmp/err"; rc=$?
check "unreachable: exit 3" test $rc -eq 3
check "unreachable: message" grep -q "^ftp-gear-bench: error: .*unreachable" "$tmp/err"
"$bench" --url "$url" --write-capacity --gear economy >/dev/null 2>&1; rc=$?
check "--write-capacity without --gears: exit 2" test $rc -eq 2
"$bench" --url "$url" --gears "$tmp/gears.json" --gear turbo >/dev/null 2>"$tmp/err"; rc=$?
check "unknown gear: exit 2" test $rc -eq 2
check "unknown gear: named" grep -q 'no gear named "turbo"' "$tmp/err"
"$bench" --url "$url" --sweep 4,2 >/dev/null 2>&1; rc=$?
check "decreasing sweep: exit 2" test $rc -eq 2

finish
