#!/bin/bash
# examples/scenarios/run.sh end to end: every run writes its interval records,
# summary and plot; the comparisons the README draws hold (relations between
# runs of the same invocation, no number copied from the README).
set -u
src=$3
data=${FTP_TEST_DATA:-$src/../shared/data}
source "$(dirname "$0")/common.sh"
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
build=$(cd "$(dirname "$2")/.." && pwd)

FTP_BUILD=$build FTP_TEST_DATA=$data "$src/examples/scenarios/run.sh" "$tmp" >"$tmp/stdout" 2>"$tmp/stderr"; rc=$?
check "run.sh: exit 0" test $rc -eq 0
[ $rc -eq 0 ] || cat "$tmp/stderr"
s() { echo "$tmp/$1.summary.json"; }
runs="a-static-tp4 a-static-tp8 a-dynamic-tp a-gear-shifter"
for v in poisson bursty; do for p in static-economy static-standard static-performance gear-shifter naive; do runs+=" b-$v-$p"; done; done
for r in $runs; do
  service=simulated-engine; case $r in b-*) service=queueing-model ;; esac
  check "$r: summary of the $service" jq -e --arg s $service '.kind=="ftp.sim-summary/v1" and .service==$s and .requests>1000' "$(s "$r")"
  check "$r: interval records" jq -e -s 'length>300 and all(.[]; .kind=="ftp.sim-interval/v1")' "$tmp/$r.jsonl"
  if command -v gnuplot >/dev/null; then check "$r: plot" grep -q "<svg" "$tmp/$r.svg"; fi
done
check "results.md: a table row per run" test "$(grep -c '^| [ab]-' "$tmp/results.md")" -ge 14
check "(a) gears: tp2 < tp4 < tp8, one replica each" \
  jq -e '[.gears[] | [.name, .tp, .dp]] == [["tp2",2,1],["tp4",4,1],["tp8",8,1]] and .gears[0].estimated.max_rps < .gears[1].estimated.max_rps and .gears[1].estimated.max_rps < .gears[2].estimated.max_rps' "$tmp/a-gears.json"
check "(a) bursty: the 10 s peak is over 4 x the mean" \
  jq -e -s '[.[].load_rps] as $l | ($l | max) > 4 * ($l | add / length)' "$tmp/a-static-tp8.jsonl"
check "(a) TP8 meets the SLA more often than TP4, at more GPU-hours and lower utilization" \
  jq -e --slurpfile t4 "$(s a-static-tp4)" '.sla_attainment > $t4[0].sla_attainment and .gpu_hours > $t4[0].gpu_hours and .mean_utilization < $t4[0].mean_utilization' "$(s a-static-tp8)"
check "(a) engine model: TP8 decodes faster than TP4 (P99 TPOT)" \
  jq -e --slurpfile t4 "$(s a-static-tp4)" '.p99.tpot_ms < $t4[0].p99.tpot_ms' "$(s a-static-tp8)"
check "(a) dynamic-tp: fewer GPU-hours than TP8, better SLA than TP4, uses all three gears" \
  jq -e --slurpfile t4 "$(s a-static-tp4)" --slurpfile t8 "$(s a-static-tp8)" \
    '.gpu_hours < $t8[0].gpu_hours and .sla_attainment > $t4[0].sla_attainment and (.gear_time_s|length)==3' "$(s a-dynamic-tp)"
check "(a) gear shifter: fewer GPU-hours than dynamic-tp and TP8, better SLA than TP4, shifts up and down" \
  jq -e --slurpfile t4 "$(s a-static-tp4)" --slurpfile t8 "$(s a-static-tp8)" --slurpfile d "$(s a-dynamic-tp)" \
    '.gpu_hours < $d[0].gpu_hours and .gpu_hours < $t8[0].gpu_hours and .sla_attainment > $t4[0].sla_attainment and .shifts >= 2' "$(s a-gear-shifter)"
for v in poisson bursty; do
  check "(b) $v: only static performance carries 600 req/s" \
    jq -e --slurpfile e "$(s b-$v-static-economy)" --slurpfile st "$(s b-$v-static-standard)" \
      '.sla_attainment > 0.99 and $e[0].sla_attainment < 0.5 and $st[0].sla_attainment < 0.5' "$(s b-$v-static-performance)"
  check "(b) $v: the gear shifter shifts up and back down, at fewer GPU-hours than static performance" \
    jq -e --slurpfile p "$(s b-$v-static-performance)" \
      '.shifts >= 2 and .final_gear=="standard" and .gear_time_s.performance > 0 and .gpu_hours < $p[0].gpu_hours and .sla_attainment > 0.5' "$(s b-$v-gear-shifter)"
done
check "(b) bursty: naive flaps, the gear shifter does not, and meets the SLA more often" \
  jq -e --slurpfile n "$(s b-bursty-naive)" '$n[0].shifts > 5 * .shifts and .sla_attainment > $n[0].sla_attainment' "$(s b-bursty-gear-shifter)"
if [ -r "$data/traces/azure-llm-2023/AzureLLMInferenceTrace_conv.csv" ]; then
  for p in static-economy static-standard static-performance gear-shifter naive; do
    check "(b) Azure $p: the whole trace on the engine model" \
      jq -e '.service=="simulated-engine" and .requests==19366 and .trace.mean_prompt_tokens > 1000' "$(s b-azure-$p)"
  done
  check "(b) Azure: static standard meets the SLA for most requests, economy for few" \
    jq -e --slurpfile e "$(s b-azure-static-economy)" '.sla_attainment > 0.9 and $e[0].sla_attainment < 0.5' "$(s b-azure-static-standard)"
  check "(b) Azure: static performance meets standard's SLA without preemption, at more GPU-hours" \
    jq -e --slurpfile st "$(s b-azure-static-standard)" \
      '.preemptions == 0 and .sla_attainment >= $st[0].sla_attainment - 0.01 and .gpu_hours > 1.5 * $st[0].gpu_hours' \
      "$(s b-azure-static-performance)"
  check "(b) Azure: the gear shifter within a point of static standard's SLA; it shifts less than naive" \
    jq -e --slurpfile n "$(s b-azure-naive)" --slurpfile st "$(s b-azure-static-standard)" \
      '.sla_attainment >= $st[0].sla_attainment - 0.01 and .shifts < $n[0].shifts' "$(s b-azure-gear-shifter)"
else
  echo "skip: no Azure trace under $data (set FTP_TEST_DATA): (b) Azure not checked"
fi
# (c) 8 B on 8 x A100, gears TP 1/2/4/8: issue 18's goal, gear shifter SLA >= best static - 1 point
# at <= 60 % of that gear's GPU-hours. Checked where it is met (bursty synthetic); printed for all.
for v in bursty code conv mooncake; do
  [ -r "$(s c-$v-gear-shifter)" ] || { echo "skip: (c) $v not run (trace absent?)"; continue; }
  best=$(for g in 1 2 4 8; do jq -r --arg g $g '"\(.sla_attainment) \(.gpu_hours) tp\($g)"' "$(s c-$v-static-tp$g)"; done |
    sort -k1,1gr -k2,2g | head -1)
  read -r bsla bgh bname <<<"$best"
  jq -r --arg b "$bname" --argjson bs "$bsla" --argjson bg "$bgh" \
    '"(c) \(input_filename | sub(".*/"; "")): SLA \(.sla_attainment) vs best static \($b) \($bs), GPU-hours \((100 * .gpu_hours / $bg) | floor) % of it: goal \(if .sla_attainment >= $bs - 0.01 and .gpu_hours <= 0.6 * $bg then "met" else "not met" end)"' \
    "$(s c-$v-gear-shifter)"
  check "(c) $v: every static gear, the planner, naive and the gear shifter ran" \
    jq -e -s 'length == 7 and all(.[]; .kind=="ftp.sim-summary/v1" and .requests > 1000)' \
      "$(s c-$v-static-tp1)" "$(s c-$v-static-tp2)" "$(s c-$v-static-tp4)" "$(s c-$v-static-tp8)" \
      "$(s c-$v-tp-planner)" "$(s c-$v-naive)" "$(s c-$v-gear-shifter)"
done
check "(c), (h) results.md: a hindsight bound per trace" test "$(grep -c '^hindsight bound' "$tmp/results.md")" -eq "$(ls "$tmp"/[ch]-*-gear-shifter.summary.json | wc -l)"
check "(c), (h) results.md: a reactive bound per trace" test "$(grep -c '^reactive bound' "$tmp/results.md")" -eq "$(ls "$tmp"/[ch]-*-gear-shifter.summary.json | wc -l)"
# (h) held out: the same default policy on traffic the new rules were not chosen on. The README's
# claims: the urgent path, its own ramp and the TPOT drive each hold or raise the SLA attainment on
# every one; the down fit holds or lowers the GPU-hours on every one.
for f in "$tmp"/h-*-gear-shifter.summary.json; do
  [ -r "$f" ] || { echo "skip: (h) not run"; break; }
  v=${f%-gear-shifter.summary.json}
  for a in no-urgent no-urgent-ramp no-tpot-drive; do
    check "(h) $(basename "$v"): the gear shifter's SLA >= its $a ablation's" \
      jq -e --slurpfile x "$v-gear-shifter-$a.summary.json" '.sla_attainment >= $x[0].sla_attainment' "$f"
  done
  check "(h) $(basename "$v"): the gear shifter's GPU-hours <= its no-down-fit ablation's" \
    jq -e --slurpfile x "$v-gear-shifter-no-down-fit.summary.json" '.gpu_hours <= $x[0].gpu_hours' "$f"
done
[ -r "$(s h-bursty-seed11-gear-shifter)" ] &&
  check "(h) bursty seed 11: the gear shifter meets the goal against static tp8" \
    jq -e --slurpfile t8 "$(s h-bursty-seed11-static-tp8)" \
      '.sla_attainment >= $t8[0].sla_attainment - 0.01 and .gpu_hours <= 0.6 * $t8[0].gpu_hours' "$(s h-bursty-seed11-gear-shifter)"
check "(c) bursty: the gear shifter meets the goal against the best static gear (tp8)" \
  jq -e --slurpfile t8 "$(s c-bursty-static-tp8)" --slurpfile t4 "$(s c-bursty-static-tp4)" \
    '$t8[0].sla_attainment >= $t4[0].sla_attainment and .sla_attainment >= $t8[0].sla_attainment - 0.01 and .gpu_hours <= 0.6 * $t8[0].gpu_hours' \
    "$(s c-bursty-gear-shifter)"
if [ -s "$(s c-code-gear-shifter)" ]; then
  f_rows() { sed -n '/^## (f)/,$p' "$tmp/results.md" | grep "^| $1 | [0-9.]* | $2 |"; }
  check "(f) results.md: a row per family for the code trace" test "$(f_rows c-code '[a-z0-9 -]*' | wc -l)" -eq 9
  check "(f) code: no causal forecaster meets the goal" \
    test "$(f_rows c-code '\(reactive\|ewma\|holt\|roc\|backlog-lead\|reserve\)' | grep -c '| no |$')" -eq 6
  check "(f) code: the prompt tokens known 5 s ahead meet it" bash -c "$(declare -f f_rows); tmp=$tmp; f_rows c-code 'foresight 5 s' | grep -q '| yes |$'"
  check "(f) bursty: the reactive floor meets the goal" bash -c "$(declare -f f_rows); tmp=$tmp; f_rows c-bursty reactive | grep -q '| yes |$'"
  check "(f) the gear shifter's look-ahead settings ran on the engine model" \
    jq -e '.service == "simulated-engine" and (.policy | startswith("gear-shifter:"))' "$(s c-code-gear-shifter-f-holt-5s)"
fi
finish
