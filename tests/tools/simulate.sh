#!/bin/bash
# ftp-plan simulate end to end: a slice of the real Azure code trace and a
# synthetic step pattern, replayed under static:economy and gear-shifter,
# once on the engine model (the default: simulated engines behind the real
# scheduler) and once on the queueing model (--service queueing): the gear
# shifter shifts and attains the SLA more often than the smallest gear
# alone; interval records and summary are well formed; the same input gives
# the same bytes; bad input is a usage error naming file and line; the
# completion offers simulate's options; shell/plot-timeline draws a PNG.
set -u
probe=$1
plan=$2
src=$3
data=${FTP_TEST_DATA:-$src/../shared/data}
source "$(dirname "$0")/common.sh"
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT

"$probe" --cluster "$src/examples/clusters/a100-8x-nvlink.json" --json=short >"$tmp/topo.json"
"$plan" --topology "$tmp/topo.json" --model "$src/examples/models/llama-7b.json" >"$tmp/gears.json"
economy=$(jq -r '.gears[0].name' "$tmp/gears.json")

engine=(--topology "$tmp/topo.json" --model "$src/examples/models/llama-7b.json")
svc=()
compare() {  # compare NAME SERVICE ARGS...: static smallest gear vs gear shifter on SERVICE (engine or queueing); sets svc
  local name="$1 ($2)" service=$2; shift 2
  if [ "$service" = engine ]; then svc=("${engine[@]}"); else svc=(--service queueing); fi
  "$plan" simulate --gears "$tmp/gears.json" "${svc[@]}" --policy "static:$economy" "$@" >"$tmp/static.jsonl" 2>"$tmp/err"; local rc1=$?
  "$plan" simulate --gears "$tmp/gears.json" "${svc[@]}" --policy gear-shifter "$@" >"$tmp/gs.jsonl" 2>>"$tmp/err"; local rc2=$?
  check "$name: exit 0" test $rc1 -eq 0 -a $rc2 -eq 0
  check "$name: nothing on stderr" test ! -s "$tmp/err"
  tail -1 "$tmp/static.jsonl" >"$tmp/static.sum"; tail -1 "$tmp/gs.jsonl" >"$tmp/gs.sum"
  local named=queueing-model; [ "$service" = engine ] && named=simulated-engine
  check "$name: summary last, $named named" \
    jq -e --arg s "$named" '.kind=="ftp.sim-summary/v1" and .service==$s and .requests>0' "$tmp/gs.sum"
  check "$name: interval records before it" \
    jq -e -s '.[:-1] | length>10 and all(.[]; .kind=="ftp.sim-interval/v1" and (.t_s|type)=="number" and .load_rps>=0
      and (.gear|type)=="string" and .ttft_ms.p99>=.ttft_ms.p50 and .tpot_ms.p99>=0 and .utilization>=0 and .utilization<=1
      and .sla_attainment>=0 and .sla_attainment<=1 and (.shifts|type)=="number")' "$tmp/gs.jsonl"
  if [ "$service" = engine ]; then
    check "$name: token-aware fields" \
      jq -e -s '(.[:-1] | all(.[]; .prompt_tokens_s>=0 and .decode_tokens_s>=0 and .kv_usage>=0 and .kv_usage<=1
        and (.preemptions|type)=="number")) and (.[-1] | .decode_tokens>0 and .prompt_tokens>0 and .kv_usage.max>0)' "$tmp/gs.jsonl"
  fi
  check "$name: intervals 10 s apart" jq -e -s '.[:-1] | .[1].t_s - .[0].t_s == 10' "$tmp/gs.jsonl"
  check "$name: static stays on $economy" \
    jq -e --arg e "$economy" '.shifts==0 and .final_gear==$e and (.gear_time_s|keys)==[$e]' "$tmp/static.sum"
  check "$name: gear shifter shifts" jq -e '.shifts>=1 and (.gear_time_s|length)>=2' "$tmp/gs.sum"
  check "$name: gear shifter attains the SLA more often" \
    jq -e --slurpfile s "$tmp/static.sum" '.sla_attainment > $s[0].sla_attainment + 0.1 and .goodput_rps > $s[0].goodput_rps' "$tmp/gs.sum"
  check "$name: and pays in GPU-hours" jq -e --slurpfile s "$tmp/static.sum" '.gpu_hours > $s[0].gpu_hours' "$tmp/gs.sum"
  jq -c '{policy, sla_attainment, goodput_rps, p99, gpu_hours, mean_utilization, shifts}' "$tmp/static.sum" "$tmp/gs.sum"
}

azure=$data/traces/azure-llm-2023/AzureLLMInferenceTrace_code.csv
if [ -r "$azure" ]; then
  for service in engine queueing; do
    compare "azure code slice" $service --trace "$azure" --start 600 --duration 2400 --rate-scale 6
    check "azure ($service): trace named in the summary" \
      jq -e '.trace.format=="azure-csv" and .trace.rate_scale==6 and .duration_s==400 and .requests>6000' "$tmp/gs.sum"
  done
  cp "$tmp/gs.jsonl" "$tmp/azure.jsonl"
  "$plan" simulate --gears "$tmp/gears.json" "${engine[@]}" --policy gear-shifter --trace "$azure" --duration 600 >"$tmp/a1"
  "$plan" simulate --gears "$tmp/gears.json" "${engine[@]}" --policy gear-shifter --trace "$azure" --duration 600 >"$tmp/a2"
  check "azure, engine model: the same input gives the same bytes" cmp -s "$tmp/a1" "$tmp/a2"
else
  echo "skip: no Azure trace at $azure (set FTP_TEST_DATA)"
fi

for service in engine queueing; do
  # 20 min after the surge: a step down waits for the 5 min peak window and
  # each gear's dwell (default policy), so two steps down take over 10 min.
  compare "steps 4,30,4,4 req/s" $service --rate-pattern steps:4,30,4,4@600 --seed 2
  check "steps ($service): up in the surge, down after it" \
    jq -e -s --arg e "$economy" '.[:-1] as $r | ($r[80].gear!=$e) and ($r[-1].gear==$e or $r[-1].shift_to==$e)' "$tmp/gs.jsonl"
  check "steps ($service): seeded, deterministic" cmp -s "$tmp/gs.jsonl" \
    <("$plan" simulate --gears "$tmp/gears.json" "${svc[@]}" --policy gear-shifter --rate-pattern steps:4,30,4,4@600 --seed 2)
done
"$plan" simulate --gears "$tmp/gears.json" "${engine[@]}" --rate-pattern const:3 --duration 120 --seed 4 \
  --prompt-lengths uniform:100,300 --output-lengths lognormal:50,0.5 --policy "static:$economy" >"$tmp/out"; rc=$?
check "synthetic lengths from --prompt-lengths and --output-lengths: exit 0" test $rc -eq 0
check "synthetic lengths: their means" \
  jq -e -s '.[-1].trace | .mean_prompt_tokens > 180 and .mean_prompt_tokens < 220 and .mean_output_tokens > 40 and .mean_output_tokens < 60' "$tmp/out"
"$plan" simulate --gears "$tmp/gears.json" "${engine[@]}" --rate-pattern const:3 --duration 120 --seed 4 \
  --prompt-lengths 300 --output-lengths 40 --policy "static:$economy" >"$tmp/out"
check "constant lengths: every request decodes its 40 tokens and prefills its 300 (or more, recomputed)" \
  jq -e -s '.[-1] | .finished==.requests and .decode_tokens==40*.requests and .prompt_tokens>=300*.requests' "$tmp/out"

# A calibration with half the compute efficiency: prefill-bound TTFTs grow.
printf '{"kind": "ftp.sim-calibration/v1", "compute_efficiency": 0.25, "attention_efficiency": 0.25}\n' >"$tmp/cal.json"
cal_run() { "$plan" simulate --gears "$tmp/gears.json" "${engine[@]}" --rate-pattern const:1 --duration 120 \
  --prompt-lengths 2000 --output-lengths 10 --policy "static:$economy" "$@" | tail -1; }
cal_run >"$tmp/cal0.sum"; cal_run --calibration "$tmp/cal.json" >"$tmp/cal1.sum"
check "--calibration: half the compute efficiency, longer prefills" \
  jq -e --slurpfile a "$tmp/cal0.sum" '.p50.ttft_ms > 1.5 * $a[0].p50.ttft_ms' "$tmp/cal1.sum"
"$plan" simulate --gears "$tmp/gears.json" "${engine[@]}" --policy dynamic-tp --rate-pattern day:2,30@1200 --burstiness 2 \
  --summary "$tmp/sum.json" >"$tmp/out"; rc=$?
check "dynamic-tp, day curve, gamma: exit 0" test $rc -eq 0
check "--summary: to the file, stdout only intervals" jq -e -s 'all(.[]; .kind=="ftp.sim-interval/v1") and length>=120' "$tmp/out"
check "--summary: policy named" jq -e '.kind=="ftp.sim-summary/v1" and .policy=="dynamic-tp" and .policy_name=="tp-planner"' "$tmp/sum.json"
"$plan" --topology "$tmp/topo.json" --model "$src/examples/models/llama-7b.json" simulate --policy naive \
  --rate-pattern const:5 --duration 300 >"$tmp/out"; rc=$?
check "--topology/--model instead of --gears" test $rc -eq 0 -a "$(tail -1 "$tmp/out" | jq -r .policy_name)" = naive

expect_error() {  # expect_error NAME PATTERN ARGS...
  local name=$1 pattern=$2; shift 2
  "$plan" "$@" </dev/null >"$tmp/out" 2>"$tmp/err"; local rc=$?
  check "$name: exit 2" test $rc -eq 2
  check "$name: message" grep -qF -- "$pattern" "$tmp/err"
  check "$name: nothing on stdout" test ! -s "$tmp/out"
}
printf 'TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:17:03.9799600,4808,10\n2023-11-16 18:17:04.0319600,x,8\n' >"$tmp/bad.csv"
expect_error "bad CSV line" "ftp-plan: error: $tmp/bad.csv:3: ContextTokens: expected a non-negative integer, got \"x\"" \
  simulate --gears "$tmp/gears.json" "${engine[@]}" --trace "$tmp/bad.csv"
printf '{"timestamp": 0, "input_length": 5, "output_length": 1}\n{"timestamp": 10, "output_length": 1}\n' >"$tmp/bad.jsonl"
expect_error "bad JSONL line" "ftp-plan: error: $tmp/bad.jsonl:2: input_length: missing required field" \
  simulate --gears "$tmp/gears.json" "${engine[@]}" --trace "$tmp/bad.jsonl"
expect_error "unknown static gear" 'gear "turbo" is not in the gear table' \
  simulate --gears "$tmp/gears.json" "${engine[@]}" --rate-pattern const:1 --duration 60 --policy static:turbo
expect_error "unknown policy" '--policy: unknown policy "bogus"' simulate --gears "$tmp/gears.json" "${engine[@]}" --rate-pattern const:1 --duration 60 --policy bogus
expect_error "bad pattern" '--rate-pattern: unknown pattern "ramp"' simulate --gears "$tmp/gears.json" "${engine[@]}" --rate-pattern ramp:1
expect_error "no arrivals" "give one of --trace and --rate-pattern" simulate --gears "$tmp/gears.json"
expect_error "no table" "give --gears, or --topology and --model" simulate --service queueing --rate-pattern const:1 --duration 60
expect_error "missing trace" "nope.csv: cannot open the trace file" simulate --gears "$tmp/gears.json" "${engine[@]}" --trace "$tmp/nope.csv"
expect_error "NaN option" "--service-time-s: must be a finite number > 0, got nan" \
  simulate --gears "$tmp/gears.json" --rate-pattern const:1 --duration 60 --service-time-s nan
expect_error "queueing option on the engine model" "--service-time-s: acts only with --service queueing" \
  simulate --gears "$tmp/gears.json" "${engine[@]}" --rate-pattern const:1 --duration 60 --service-time-s 2
expect_error "engine option on the queueing model" "--max-running: acts only with --service engine" \
  simulate --gears "$tmp/gears.json" --service queueing --rate-pattern const:1 --duration 60 --max-running 8
expect_error "engine model without the topology" "the engine model needs --topology and --model" \
  simulate --gears "$tmp/gears.json" --rate-pattern const:1 --duration 60
expect_error "bad length distribution" "--prompt-lengths: MAX must be >= MIN" \
  simulate --gears "$tmp/gears.json" "${engine[@]}" --rate-pattern const:1 --duration 60 --prompt-lengths uniform:9,3
expect_error "lengths with a trace" "act only with --rate-pattern" \
  simulate --gears "$tmp/gears.json" "${engine[@]}" --trace "$tmp/bad.csv" --prompt-lengths 100
expect_error "unknown service" "--service: " simulate --gears "$tmp/gears.json" --service mm1 --rate-pattern const:1 --duration 60
expect_error "too many arrivals" "more than 20000000 requests" simulate --gears "$tmp/gears.json" "${engine[@]}" --rate-pattern const:1e9 --duration 60
expect_error "burstiness past 100" "--burstiness: must be in (0, 100], got 1e+09" \
  simulate --gears "$tmp/gears.json" "${engine[@]}" --rate-pattern const:5 --duration 60 --burstiness 1e9
expect_error "--gears and --topology, queueing" "simulate: --gears is the table to replay" \
  simulate --service queueing --gears "$tmp/gears.json" --topology "$tmp/topo.json" --model x --rate-pattern const:1 --duration 60
expect_error "table without capacities: the file named" "ftp-plan: error: $src/examples/gears/stories260K-cpu.json: gears[0]: gear \"economy\" has no measured or estimated capacity" \
  simulate --service queueing --gears "$src/examples/gears/stories260K-cpu.json" --rate-pattern const:1 --duration 60
"$plan" simulate --help >"$tmp/out"; rc=$?
check "simulate --help: exit 0, names the engine and the queueing model" sh -c "grep -q queueing '$tmp/out' && grep -q 'simulated engine' '$tmp/out'"

# Bash completion offers simulate and every option of simulate --help.
source "$src/shell/ftp-completion.bash"
COMP_WORDS=(ftp-plan ""); COMP_CWORD=1; COMPREPLY=(); _ftp_plan
check "completion offers simulate" grep -qx simulate <(printf '%s\n' "${COMPREPLY[@]}")
COMP_WORDS=(ftp-plan simulate --); COMP_CWORD=2; COMPREPLY=(); _ftp_plan
for opt in $("$plan" simulate --help | grep -oE -- '--[a-z][a-z-]+' | sort -u); do
  check "completion offers simulate $opt" grep -qx -- "$opt" <(printf '%s\n' "${COMPREPLY[@]}")
done
COMP_WORDS=(ftp-plan simulate --policy ""); COMP_CWORD=3; COMPREPLY=(); _ftp_plan
check "completion offers the policies" grep -qx gear-shifter <(printf '%s\n' "${COMPREPLY[@]}")

# The timeline plot.
if command -v gnuplot >/dev/null; then
  in=$tmp/gs.jsonl; [ -r "$tmp/azure.jsonl" ] && in=$tmp/azure.jsonl
  "$src/shell/plot-timeline" "$in" "$tmp/t.png"; rc=$?
  check "plot-timeline: exit 0" test $rc -eq 0
  check "plot-timeline: a non-empty PNG" sh -c "test -s '$tmp/t.png' && head -c 8 '$tmp/t.png' | grep -q PNG"
  "$src/shell/plot-timeline" "$in" "$tmp/t.svg"
  check "plot-timeline: an SVG" grep -q "<svg" "$tmp/t.svg"
else
  echo "skip: gnuplot not installed (apt-get install gnuplot-nox); plot-timeline not checked"
fi

finish
