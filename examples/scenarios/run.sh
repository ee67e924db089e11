#!/bin/bash
# Reproduces every number and plot of examples/scenarios/README.md:
#   (a) a 70 B FP16 model on 8 x A100-80GB with bursty traffic: static TP4,
#       static TP8 and dynamic-tp;
#   (b) the fragmented FlexPipe cluster with the 100 -> 600 -> 100 req/s
#       pattern (Poisson, then gamma with burstiness 4) and with the Azure LLM
#       2023 conversation trace: the gear shifter against static gears and
#       the naive threshold policy.
# The service is SIMULATED (man ftp-plan(1), SIMULATE): (a) and the Azure
# trace of (b) on the engine model (simulated engines behind the real
# scheduler, cost-model step times), the 100 -> 600 -> 100 req/s pattern of
# (b) on the queueing model (--service queueing, the fast first estimate:
# its 960 000 requests take about a minute a run on the engine model here).
#
#   examples/scenarios/run.sh [OUT_DIR]     (default examples/scenarios/results)
#   FTP_SCENARIOS="c" examples/scenarios/run.sh    (only the sections named: a, b, c, h, f; h and f need c)
#
# Needs a build (FTP_BUILD, default build/: ftp-probe, ftp-plan), jq, gnuplot
# for the plots (skipped with a message without it), and for (b3) the Azure
# trace under FTP_TEST_DATA (default ../shared/data; skipped without it).
# Writes per run NAME.jsonl (interval records) and NAME.summary.json, the
# plots NAME.svg, and results.md (the tables of the README).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
build=${FTP_BUILD:-$root/build}
data=${FTP_TEST_DATA:-$root/../shared/data}
out=${1:-$here/results}
probe=$build/tools/ftp-probe
plan=$build/tools/ftp-plan
for t in "$probe" "$plan"; do
  [ -x "$t" ] || { echo "run.sh: error: $t not built (ninja -C build tools/ftp-probe tools/ftp-plan)" >&2; exit 1; }
done
command -v jq >/dev/null || { echo "run.sh: error: jq not found" >&2; exit 1; }
plots=1
command -v gnuplot >/dev/null || { plots=0; echo "run.sh: gnuplot not found: no plots (apt-get install gnuplot-nox)" >&2; }
mkdir -p "$out"
md=$out/results.md
: >"$md"

# run NAME TITLE SIMULATE-ARGS...: one replay, its summary and its plot.
run() {
  local name=$1 title=$2; shift 2
  "$plan" simulate "$@" --summary "$out/$name.summary.json" >"$out/$name.jsonl"
  [ "$plots" = 1 ] && "$root/shell/plot-timeline" "$out/$name.jsonl" "$out/$name.svg" "$title"
  return 0
}

# table HEADING NAME...: the summaries as a Markdown table, to stdout and results.md.
table() {
  local heading=$1; shift
  {
    echo "### $heading"
    echo
    echo "| run | service | policy | SLA attainment | goodput req/s | P99 TTFT ms | P99 TPOT ms | mean utilization | GPU-hours | shifts | KV max | preemptions | time per gear (s) |"
    echo "|---|---|---|---|---|---|---|---|---|---|---|---|---|"
    for n in "$@"; do
      jq -r --arg n "$n" '"| \($n) | \(.service | sub("-model"; "") | sub("simulated-"; "")) | \(.policy | sub(":.*/"; ":")) | \(.sla_attainment) | \(.goodput_rps) | \(.p99.ttft_ms | round) | \(.p99.tpot_ms)"
        + " | \(.mean_utilization) | \(.gpu_hours) | \(.shifts) | \(.kv_usage.max // "-") | \(.preemptions // "-") | \(.gear_time_s | to_entries | map("\(.key) \(.value | round)") | join(", ")) |"' \
        "$out/$n.summary.json"
    done
    echo
  } | tee -a "$md"
}

# compare PREFIX TITLE SIMULATE-ARGS...: (b)'s five policies on the same traffic -- static
# economy, standard and performance, the gear shifter and the naive policy -- their run names in
# the array names.
compare() {
  local prefix=$1 title=$2; shift 2
  names=()
  for g in economy standard performance; do
    run "$prefix-static-$g" "(b) static $g, $title" "$@" --policy "static:$g"
    names+=("$prefix-static-$g")
  done
  for p in gear-shifter naive; do
    run "$prefix-$p" "(b) $p, $title" "$@" --policy "$p" --start-gear standard
    names+=("$prefix-$p")
  done
}

# gears_line LABEL GEARS.json: a planned table's gears and their estimated capacity, one line.
gears_line() {
  jq -r --arg l "$1" '"gears, \($l) (estimated max req/s): " + ([.gears[] | "\(.name) tp=\(.tp) pp=\(.pp) dp=\(.dp) \(.estimated.max_rps * 10 | round / 10)"] | join(", "))' "$2"
}

# load NAME: mean and peak of the 10 s load of a run, and their ratio.
load() {
  jq -s -r '[.[].load_rps] as $l | ($l | add / length) as $m
    | "offered load (10 s intervals): mean \($m * 100 | round / 100) req/s, peak \($l | max) req/s = \($l | max / $m * 10 | round / 10) x the mean"' \
    "$out/$1.jsonl" | tee -a "$md"
  echo | tee -a "$md"
}

# want X: section X is asked for (FTP_SCENARIOS, default all: "a b c h f").
want() { case " ${FTP_SCENARIOS:-a b c h f} " in *" $1 "*) return 0 ;; esac; return 1; }
# The A100 node's topology: (a) and (c) run on it.
"$probe" --cluster "$root/examples/clusters/a100-8x-nvlink.json" --json=short >"$out/a100.topo.json"

if want a; then
# ---------------------------------------------------------------- (a)
# Llama-2-70B shapes in FP16 (2 bytes a parameter, as bf16) on one HGX A100 node; a TP ladder
# for the TP planner: TP2, TP4, TP8, one replica each.
jq '.name = "llama-70b-f16" | .dtype = "f16" | .comment = "Llama-2 70B shapes in FP16"' \
  "$root/examples/models/llama-70b.json" >"$out/llama-70b-f16.json"
"$plan" --topology "$out/a100.topo.json" --model "$out/llama-70b-f16.json" \
  --layout tp2:tp=2 --layout tp4:tp=4 --layout tp8:tp=8 --json=short >"$out/a-gears.json"
# Bursty: 1.2 req/s with two 150 s bursts at 8 req/s (4.5 x the pattern's mean), gamma gaps with a
# CV of 2 on top; 512 prompt and 128 output tokens each, on the engine model (a shift costs its
# phases; the three gears keep their weights resident: the TP shards are views of the same bytes).
burst=steps:1.2,1.2,1.2,1.2,8,1.2,1.2,1.2,1.2,1.2,1.2,1.2,1.2,1.2,1.2,1.2,8,1.2,1.2,1.2,1.2,1.2,1.2,1.2@150
a_args=(--gears "$out/a-gears.json" --topology "$out/a100.topo.json" --model "$out/llama-70b-f16.json"
        --rate-pattern "$burst" --burstiness 2 --seed 7)
run a-static-tp4 "(a) static TP4, 70B FP16 on 8x A100-80GB, bursty" "${a_args[@]}" --policy static:tp4
run a-static-tp8 "(a) static TP8, 70B FP16 on 8x A100-80GB, bursty" "${a_args[@]}" --policy static:tp8
run a-dynamic-tp "(a) dynamic-tp, 70B FP16 on 8x A100-80GB, bursty" "${a_args[@]}" \
  --policy "dynamic-tp:$here/dynamic-tp.json" --start-gear tp2
run a-gear-shifter "(a) gear shifter, 70B FP16 on 8x A100-80GB, bursty" "${a_args[@]}" --policy gear-shifter \
  --start-gear tp4
{
  echo "## (a) 70 B FP16 on 8 x A100-80GB, bursty traffic"
  echo
  jq -r '"gears (estimated max req/s): " + ([.gears[] | "\(.name) \(.estimated.max_rps * 100 | round / 100)"] | join(", "))' "$out/a-gears.json"
  echo
} | tee -a "$md"
load a-static-tp8
table "static TP4, static TP8, dynamic-tp, gear shifter" a-static-tp4 a-static-tp8 a-dynamic-tp a-gear-shifter

fi

if want b; then
# ---------------------------------------------------------------- (b)
# The fragmented cluster of the FlexPipe design (4 x A800 + L40S | 4 x T4 + A100 MIG slices, 10 Gb/s
# between). TinyLlama-1.1B shapes: the planner's gears then span the pattern (economy ~111 req/s
# on one A800, performance ~733 req/s on all twelve devices).
"$probe" --cluster "$root/examples/clusters/flexpipe-fragmented.json" --json=short >"$out/fragmented.topo.json"
"$plan" --topology "$out/fragmented.topo.json" --model "$root/examples/models/tinyllama-1.1b.json" --json=short \
  >"$out/b-gears.json"
{
  echo "## (b) the fragmented cluster"
  echo
  gears_line tinyllama-1.1b "$out/b-gears.json"
  echo
} | tee -a "$md"
for variant in poisson:1 bursty:4; do
  v=${variant%%:*}; cv=${variant#*:}
  compare "b-$v" "100-600-100 req/s ($v), fragmented, queueing model" \
    --service queueing --gears "$out/b-gears.json" --rate-pattern steps:100,600,100@1200 --burstiness "$cv" --seed 3
  table "100 -> 600 -> 100 req/s, 20 min each, gamma CV $cv" "${names[@]}"
done

# The Azure conversation trace (1 h, 19 366 requests, mean 1155 prompt / 211 output tokens) on
# Llama-2-7B shapes, planned for that request, on the engine model: each request's own lengths.
azure=$data/traces/azure-llm-2023/AzureLLMInferenceTrace_conv.csv
if [ -r "$azure" ]; then
  "$plan" --topology "$out/fragmented.topo.json" --model "$root/examples/models/llama-7b.json" \
    --prompt-tokens 1155 --output-tokens 211 --json=short >"$out/b-azure-gears.json"
  {
    gears_line "llama-7b for the trace's mean request" "$out/b-azure-gears.json"
    echo
  } | tee -a "$md"
  compare b-azure "Azure conversation trace, fragmented" \
    --gears "$out/b-azure-gears.json" --topology "$out/fragmented.topo.json" --model "$root/examples/models/llama-7b.json" \
    --trace "$azure"
  load b-azure-static-standard
  table "Azure LLM 2023 conversation trace" "${names[@]}"
else
  echo "run.sh: skip (b) Azure: $azure not found (set FTP_TEST_DATA)" | tee -a "$md" >&2
fi

fi

if want c; then
# ---------------------------------------------------------------- (c)
# The goal of issue #18 for the gear shifter, per trace: an SLA attainment at least the best static
# gear's minus one point, at no more than 60 % of that gear's GPU-hours. One model, one cluster, one
# gear table and one policy configuration (the defaults) for every trace: Llama-3.1-8B shapes (its
# 128k context, so that Mooncake's long prompts fit) on 8 x A100-80GB, a TP ladder tp1 < tp2 < tp4 <
# tp8 of one replica each; SLA TTFT <= 2 s, TPOT <= 100 ms.
jq '.name = "llama-3.1-8b-128k" | .context_length = 131072 | .comment = "Llama-3.1 8B shapes, its 128k context"' \
  "$root/examples/models/llama-3.1-8b.json" >"$out/llama-3.1-8b-128k.json"
"$plan" --topology "$out/a100.topo.json" --model "$out/llama-3.1-8b-128k.json" --context 16384 \
  --layout tp1:tp=1 --layout tp2:tp=2 --layout tp4:tp=4 --layout tp8:tp=8 --json=short >"$out/c-gears.json"
# Ablations: the gear shifter with the rules added for the goal turned off one at a time, and all of
# them (the seed's rules only).
echo '{"kind":"ftp.policy/v1","gear_shifter":{"up_dwell_s":300,"down_peak_window_s":0,"backlog_drive_s":0,"backlog_derate_floor":1,"ttft_slo_ms":0,"tpot_slo_ms":0,"urgent_backlog_s":0,"down_fit":0}}' >"$out/c-seed.json"
echo '{"kind":"ftp.policy/v1","gear_shifter":{"up_dwell_s":300}}' >"$out/c-no-up-dwell.json"
echo '{"kind":"ftp.policy/v1","gear_shifter":{"down_peak_window_s":0}}' >"$out/c-no-down-peak.json"
echo '{"kind":"ftp.policy/v1","gear_shifter":{"backlog_drive_s":0}}' >"$out/c-no-backlog-drive.json"
echo '{"kind":"ftp.policy/v1","gear_shifter":{"backlog_derate_floor":1}}' >"$out/c-no-derate.json"
echo '{"kind":"ftp.policy/v1","gear_shifter":{"ttft_slo_ms":0,"tpot_slo_ms":0}}' >"$out/c-no-latency-drive.json"
echo '{"kind":"ftp.policy/v1","gear_shifter":{"tpot_slo_ms":0}}' >"$out/c-no-tpot-drive.json"
echo '{"kind":"ftp.policy/v1","gear_shifter":{"urgent_backlog_s":0}}' >"$out/c-no-urgent.json"
echo '{"kind":"ftp.policy/v1","gear_shifter":{"urgent_ramp":[]}}' >"$out/c-no-urgent-ramp.json"
echo '{"kind":"ftp.policy/v1","gear_shifter":{"down_fit":0}}' >"$out/c-no-down-fit.json"
# The forecast's EWMA weight per observation (1 s apart) instead of per 10 s.
echo '{"kind":"ftp.policy/v1","predictor":{"alpha_period_s":0}}' >"$out/c-per-sample-alpha.json"
# The burst return and the backlog lead are off by default; these rows turn them on (30 s, 2 s).
echo '{"kind":"ftp.policy/v1","gear_shifter":{"burst_return_s":30}}' >"$out/c-burst-return.json"
echo '{"kind":"ftp.policy/v1","gear_shifter":{"backlog_lead_s":2}}' >"$out/c-backlog-lead.json"
c_policies="static:tp1 static:tp2 static:tp4 static:tp8 gear-shifter dynamic-tp:$here/dynamic-tp.json naive"
for a in seed no-up-dwell no-down-peak no-backlog-drive no-derate no-latency-drive no-tpot-drive no-urgent no-urgent-ramp \
         no-down-fit per-sample-alpha burst-return backlog-lead; do
  c_policies+=" gear-shifter:$out/c-$a.json"
done

# flaps NAME: shifts that return to the gear the shift before left, within 600 s of it.
flaps() {
  jq -s '[.[] | select(.kind == "ftp.sim-interval/v1") | {t: .t_s, g: .gear}]
    | reduce .[] as $r ({last: null, shifts: []}; if .last != null and $r.g != .last then .shifts += [{t: $r.t, from: .last, to: $r.g}] else . end | .last = $r.g)
    | .shifts as $s | [range(1; $s | length) | select($s[.].to == $s[. - 1].from and $s[.].t - $s[. - 1].t <= 600)] | length' "$out/$1.jsonl"
}

# goal_table HEADING PREFIX: one row per policy of (c) and the goal's verdict, to stdout and results.md.
goal_table() {
  local heading=$1 prefix=$2 rows=() p n
  for p in $c_policies; do
    n=$(echo "$p" | sed -e 's,^static:,static-,' -e 's,^dynamic-tp:.*,tp-planner,' -e 's,^gear-shifter:.*/c-\(.*\)\.json,gear-shifter-\1,')
    rows+=("$prefix-$n")
  done
  {
    echo "### $heading"
    echo
    echo "| run | policy | SLA attainment | goodput req/s | GPU-hours | shifts/hour | flaps | P99 TTFT ms | P99 TPOT ms | time per gear (s) |"
    echo "|---|---|---|---|---|---|---|---|---|---|"
    for n in "${rows[@]}"; do
      jq -r --arg n "$n" --argjson f "$(flaps "$n")" '"| \($n) | \(.policy | sub(":.*/"; ":")) | \(.sla_attainment) | \(.goodput_rps) | \(.gpu_hours) | \(.shifts / .duration_s * 3600 * 10 | round / 10) | \($f)"
        + " | \(.p99.ttft_ms | round) | \(.p99.tpot_ms) | \(.gear_time_s | to_entries | map("\(.key) \(.value | round)") | join(", ")) |"' \
        "$out/$n.summary.json"
    done
    echo
    # The best static gear: the highest SLA attainment, the fewest GPU-hours among equals.
    jq -s -r '(map(select(.policy | startswith("static:"))) | sort_by(-.sla_attainment, .gpu_hours) | .[0]) as $b
      | (map(select(.policy == "gear-shifter")) | .[0]) as $g
      | "goal: best static gear \($b.policy | sub("static:"; "")) (SLA \($b.sla_attainment), \($b.gpu_hours) GPU-hours); gear shifter SLA \($g.sla_attainment) "
        + (if $g.sla_attainment >= $b.sla_attainment - 0.01 then ">=" else "<" end) + " \($b.sla_attainment - 0.01 | . * 1000 | round / 1000), GPU-hours \($g.gpu_hours) = \($g.gpu_hours / $b.gpu_hours * 100 | round) % of its "
        + (if $g.gpu_hours <= 0.6 * $b.gpu_hours then "<=" else ">" end) + " 60 %: "
        + (if $g.sla_attainment >= $b.sla_attainment - 0.01 and $g.gpu_hours <= 0.6 * $b.gpu_hours then "met" else "NOT met" end)' \
      $(for n in "${rows[@]}"; do echo "$out/$n.summary.json"; done)
    echo
    python3 "$here/hindsight-bound.py" "$out" "$prefix" $(jq -r '.gears[].name' "$out/c-gears.json")
    echo
  } | tee -a "$md"
}

# goal PREFIX TITLE SIMULATE-ARGS...: every policy of (c) on the same traffic, then its table;
# the traffic's arguments are kept in goal_args[PREFIX] for (f).
declare -A goal_args
goal() {
  local prefix=$1 title=$2 p n; shift 2
  goal_args[$prefix]=$(printf '%q ' "$@")
  for p in $c_policies; do
    n=$(echo "$p" | sed -e 's,^static:,static-,' -e 's,^dynamic-tp:.*,tp-planner,' -e 's,^gear-shifter:.*/c-\(.*\)\.json,gear-shifter-\1,')
    case $p in static:*) start=() ;; *) start=(--start-gear tp4) ;; esac
    run "$prefix-$n" "(c) $n, $title" --gears "$out/c-gears.json" --topology "$out/a100.topo.json" \
      --model "$out/llama-3.1-8b-128k.json" "$@" --policy "$p" "${start[@]}"
  done
  load "$prefix-static-tp8"
  goal_table "$title" "$prefix"
}

{
  echo "## (c) the goal: gear shifter against the best static gear, per trace"
  echo
  gears_line "llama-3.1-8b on 8 x A100" "$out/c-gears.json"
  echo
} | tee -a "$md"
# Bursty synthetic: a day curve from 2 to 16 req/s over the hour, gamma gaps of CV 4, lognormal
# lengths (prompt mean 1024, output mean 200, CV 1).
goal c-bursty "bursty synthetic: day:2,16@3600, gamma CV 4" \
  --rate-pattern day:2,16@3600 --burstiness 4 --seed 7 --prompt-lengths lognormal:1024,1 --output-lengths lognormal:200,1
for tr in "conv:AzureLLMInferenceTrace_conv.csv:2.4" "code:AzureLLMInferenceTrace_code.csv:1" "mooncake:../mooncake-fast25/synthetic_trace.jsonl:0.26"; do
  IFS=: read -r key file scale <<<"$tr"
  f=$data/traces/azure-llm-2023/$file
  if [ -r "$f" ]; then
    goal "c-$key" "$key trace x $scale" --trace "$f" --rate-scale "$scale"
  else
    echo "run.sh: skip (c) $key: $f not found (set FTP_TEST_DATA)" | tee -a "$md" >&2
  fi
done

# Held out: the rules added for the goal were chosen on the runs above. The same policy (the
# defaults, no change) on traffic they were not chosen on: other scale factors, the code trace's
# second half alone, another seed of the synthetic bursts. Static gears, the gear shifter, the
# seed's rules and the ablations of the two rules added last.
if want h; then
  c_policies="static:tp1 static:tp2 static:tp4 static:tp8 gear-shifter"
  for a in seed no-urgent no-tpot-drive no-urgent-ramp no-down-fit per-sample-alpha; do c_policies+=" gear-shifter:$out/c-$a.json"; done
  echo "## (h) held out" | tee -a "$md"
  echo | tee -a "$md"
  goal h-bursty-seed11 "held out: bursty synthetic, seed 11" \
    --rate-pattern day:2,16@3600 --burstiness 4 --seed 11 --prompt-lengths lognormal:1024,1 --output-lengths lognormal:200,1
  for tr in "conv-x3:AzureLLMInferenceTrace_conv.csv:3:0" "code-x1.25:AzureLLMInferenceTrace_code.csv:1.25:0" \
            "code-late:AzureLLMInferenceTrace_code.csv:1:1800" "mooncake-x0.3:../mooncake-fast25/synthetic_trace.jsonl:0.3:0"; do
    IFS=: read -r key file scale start <<<"$tr"
    f=$data/traces/azure-llm-2023/$file
    if [ -r "$f" ]; then
      goal "h-$key" "held out: ${key%%-*} trace x $scale from trace time $start s" --trace "$f" --rate-scale "$scale" --start "$start"
    else
      echo "run.sh: skip (h) $key: $f not found (set FTP_TEST_DATA)" | tee -a "$md" >&2
    fi
  done
fi

# Forecasts: can a causal forecast of the load move the gear shifter past the reactive bound on
# the code trace (issue 18)? forecast-bound.py replays forecasters over the static gears' runs
# one second apart; then the gear shifter with its own forecast rules set to look ahead, on the
# engine model. The code traces of (c) and (h) and the bursty curves, which must not regress.
if want f; then
  echo "## (f) forecasts" | tee -a "$md"
  echo | tee -a "$md"
  echo '{"kind":"ftp.policy/v1","predictor":{"alpha":0.5,"alpha_period_s":1,"horizon_s":5}}' >"$out/f-holt-5s.json"
  echo '{"kind":"ftp.policy/v1","predictor":{"alpha":0.5,"alpha_period_s":1,"horizon_s":5},"gear_shifter":{"up_threshold":0.6,"down_fit":0.5}}' \
    >"$out/f-holt-5s-up-0.6.json"
  echo '{"kind":"ftp.policy/v1","gear_shifter":{"urgent_backlog_s":0.5,"backlog_drive_s":0.5}}' >"$out/f-urgent-0.5s.json"
  echo '{"kind":"ftp.policy/v1","gear_shifter":{"backlog_lead_s":2,"down_peak_window_s":120,"min_dwell_s":120}}' >"$out/f-lead-2s-hold-120s.json"
  f_policies="gear-shifter gear-shifter:$out/c-backlog-lead.json"
  for a in holt-5s holt-5s-up-0.6 urgent-0.5s lead-2s-hold-120s; do f_policies+=" gear-shifter:$out/f-$a.json"; done
  f_prefixes=()
  for prefix in c-code h-code-x1.25 h-code-late c-bursty h-bursty-seed11; do
    [ -n "${goal_args[$prefix]:-}" ] || { echo "run.sh: skip (f) $prefix: not replayed in (c) or (h)" | tee -a "$md" >&2; continue; }
    f_prefixes+=("$prefix")
    eval "args=(${goal_args[$prefix]})"
    common=(--gears "$out/c-gears.json" --topology "$out/a100.topo.json" --model "$out/llama-3.1-8b-128k.json" "${args[@]}")
    for g in $(jq -r '.gears[].name' "$out/c-gears.json"); do
      "$plan" simulate "${common[@]}" --policy "static:$g" --interval 1 \
        --summary "$out/$prefix.1s-static-$g.summary.json" >"$out/$prefix.1s-static-$g.jsonl"
    done
    for p in $f_policies; do
      [ "$p" = gear-shifter ] && continue  # run in (c) or (h)
      n=$(echo "$p" | sed -e 's,^gear-shifter:.*/\([cf]\)-\(.*\)\.json,gear-shifter-\1-\2,')
      "$plan" simulate "${common[@]}" --policy "$p" --start-gear tp4 --summary "$out/$prefix-$n.summary.json" >"$out/$prefix-$n.jsonl"
    done
  done
  if [ ${#f_prefixes[@]} -gt 0 ]; then
    python3 "$here/forecast-bound.py" "$out/c-gears.json" "$out" "${f_prefixes[@]}" | tee -a "$md"
    {
      echo
      echo "The gear shifter with its forecast rules looking ahead, on the engine model (SLA attainment at the share of the best static gear's GPU-hours):"
      echo
      echo "| policy |$(printf ' %s |' "${f_prefixes[@]}")"
      echo "|---|$(printf -- '---|%.0s' "${f_prefixes[@]}")"
      for p in $f_policies; do
        n=$(echo "$p" | sed -e 's,^gear-shifter:.*/\([cf]\)-\(.*\)\.json,gear-shifter-\1-\2,')
        row="| $(basename "$p" .json) |"
        for prefix in "${f_prefixes[@]}"; do
          row+=$(jq -r -s '(.[1:] | map(select(.policy | startswith("static:"))) | sort_by(-.sla_attainment, .gpu_hours) | .[0]) as $b
            | " \(.[0].sla_attainment) at \(.[0].gpu_hours / $b.gpu_hours * 100 | round) % |"' \
            "$out/$prefix-$n.summary.json" "$out/$prefix"-static-*.summary.json)
        done
        echo "$row"
      done
      echo
    } | tee -a "$md"
  fi
fi
fi
echo "run.sh: results in $out (results.md, *.summary.json, *.jsonl$([ "$plots" = 1 ] && echo ", *.svg"))" >&2
