#!/bin/bash
# ftp-plan decide end to end: a synthetic observation stream through the
# gear shifter (a burst yields exactly one shift up, after the
# confirmations, with its reason and signals), the other policies, a policy
# file, and bad input lines (skipped with a warning naming line and field,
# exit 2 at the end).
set -u
probe=$1
plan=$2
src=$3
source "$(dirname "$0")/common.sh"
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT

"$probe" --cluster "$src/examples/clusters/a100-8x-nvlink.json" --json=short >"$tmp/topo.json"
"$plan" --topology "$tmp/topo.json" --model "$src/examples/models/llama-7b.json" >"$tmp/gears.json"
economy=$(jq -r '.gears[0].name' "$tmp/gears.json")
safe=$(jq -r '.gears[0].estimated.safe_rps' "$tmp/gears.json")

# One observation every 10 s on the first gear: quiet at half its safe
# capacity for 60 s, then a burst at twice it with a queue, for 3 min.
# Nobody executes the shift, so the gear stays the same.
obs() {  # obs T_S RATE QUEUE QUEUE_TIME_MS
  jq -nc --arg g "$economy" --argjson t "$1" --argjson r "$2" --argjson q "$3" --argjson qt "$4" \
    '{kind:"ftp.observation/v1", t_ms:($t*1000), gear:$g, request_rate:$r, queue_depth:$q, queue_depth_mean:$q,
      est_queue_time_ms:$qt, kv_watermark:0.4, e2e_ms:{p50:800, p99:1500}}'
}
{
  for t in 0 10 20 30 40 50; do obs $t "$(jq -n "$safe*0.5")" 0.2 20; done
  for t in $(seq 60 10 240); do obs $t "$(jq -n "$safe*2")" 30 3000; done
} >"$tmp/stream.jsonl"

"$plan" decide --gears "$tmp/gears.json" <"$tmp/stream.jsonl" >"$tmp/out" 2>"$tmp/err"; rc=$?
check "burst: exit 0" test $rc -eq 0
check "burst: one decision per observation" test "$(wc -l <"$tmp/out")" -eq "$(wc -l <"$tmp/stream.jsonl")"
check "burst: every line a decision of the gear shifter" \
  jq -e -s 'all(.[]; .kind=="ftp.decision/v1" and .policy=="gear-shifter" and (.reason|length)>0 and (.signals|length)>=5)' "$tmp/out"
check "burst: exactly one shift" jq -e -s '[.[]|select(.action=="shift")]|length==1' "$tmp/out"
check "burst: after 3 confirmations 10 s apart (t = 80 s)" jq -e -s '.[]|select(.action=="shift")|.t_ms==80000' "$tmp/out"
check "burst: up, from the first gear to a larger one" \
  jq -e -s --arg e "$economy" --slurpfile g "$tmp/gears.json" \
  '.[]|select(.action=="shift")|.from==$e and .to!=$e and (.to as $t|$g[0].gears|map(.name)|index($t))>0' "$tmp/out"
check "burst: reason and agreeing signals" \
  jq -e -s '.[]|select(.action=="shift")|(.reason|startswith("up: forecast")) and ([.signals[]|select(.agrees)|.name]|index("forecast_load")!=null and index("queue_depth")!=null)' "$tmp/out"
check "burst: confirmations counted in the holds before" \
  jq -e -s '[.[]|select(.t_ms==60000 or .t_ms==70000)|.reason]==["up: confirmation 1 of 3","up: confirmation 2 of 3"]' "$tmp/out"
check "burst: then held while the shift is pending, signals muted" \
  jq -e -s 'all(.[]|select(.t_ms>80000); .action=="hold" and (.reason|contains("signals muted")))' "$tmp/out"
check "burst: no stagger for one replica" jq -e -s 'all(.[]; has("not_before_ms")|not)' "$tmp/out"
check "burst: nothing on stderr" test ! -s "$tmp/err"

# A policy file: four replicas stagger the shift within 5 min.
jq '.gear_shifter.replicas=4 | .gear_shifter.seed=7' "$src/examples/policies/default.json" >"$tmp/stagger.json"
"$plan" decide --gears "$tmp/gears.json" --policy "$tmp/stagger.json" <"$tmp/stream.jsonl" >"$tmp/out"
check "--policy: staggered within 5 min" \
  jq -e -s '.[]|select(.action=="shift")|.not_before_ms>=80000 and .not_before_ms<=380000 and (.reason|contains("staggered by"))' "$tmp/out"
"$plan" decide --gears "$tmp/gears.json" --policy "$src/examples/policies/default.json" <"$tmp/stream.jsonl" >"$tmp/out2"
check "--policy default.json: same as no policy" cmp -s "$tmp/out2" <("$plan" decide --gears "$tmp/gears.json" <"$tmp/stream.jsonl")

"$plan" decide --gears "$tmp/gears.json" --policy-name naive <"$tmp/stream.jsonl" >"$tmp/out"
check "naive: shifts at the first burst observation" \
  jq -e -s '[.[]|select(.action=="shift")][0].t_ms==60000 and all(.[]; .policy=="naive")' "$tmp/out"
"$plan" decide --gears "$tmp/gears.json" --policy-name tp-planner <"$tmp/stream.jsonl" >"$tmp/out"; rc=$?
check "tp-planner: exit 0, a decision per line" test $rc -eq 0 -a "$(wc -l <"$tmp/out")" -eq "$(wc -l <"$tmp/stream.jsonl")"
check "tp-planner: decisions of the tp planner" jq -e -s 'all(.[]; .policy=="tp-planner")' "$tmp/out"

# Bad lines are skipped with a warning naming line and field; exit 2 at the end.
{
  obs 0 1 0 0
  obs 10 1 0 0
  obs 20 1 0 0 | jq -c '.kv_watermark=1.5'
  echo '{"kind": "ftp.observation/v1", "t_ms": 30'
  obs 40 1 0 0 | jq -c '.gear="turbo"'
  obs 50 1 0 0 | jq -c '.kind="ftp.decision/v1"'
  obs 5 1 0 0
  echo
  obs 60 1 0 0
} >"$tmp/bad.jsonl"
"$plan" decide --gears "$tmp/gears.json" <"$tmp/bad.jsonl" >"$tmp/out" 2>"$tmp/err"; rc=$?
check "bad lines: exit 2 at the end" test $rc -eq 2
check "bad lines: the good ones decided" jq -e -s 'map(.t_ms)==[0,10000,60000]' "$tmp/out"
check "bad lines: ratio" grep -qxF "ftp-plan: warning: stdin:3: kv_watermark: must be a ratio in [0, 1], got 1.5; line skipped" "$tmp/err"
check "bad lines: malformed JSON" grep -qE "^ftp-plan: warning: stdin:4: malformed JSON: .*; line skipped$" "$tmp/err"
check "bad lines: unknown gear" grep -qF "stdin:5: gear: \"turbo\" is not in the gear table" "$tmp/err"
check "bad lines: wrong kind" grep -qF 'stdin:6: kind: expected "ftp.observation/v1", got "ftp.decision/v1"' "$tmp/err"
check "bad lines: time going back" grep -qF "stdin:7: t_ms: must not go back in time, got 5000 after 10000" "$tmp/err"
check "bad lines: five warnings" test "$(grep -c warning "$tmp/err")" -eq 5

expect_error() {  # expect_error NAME PATTERN ARGS...
  local name=$1 pattern=$2; shift 2
  "$plan" "$@" </dev/null >"$tmp/out" 2>"$tmp/err"; local rc=$?
  check "$name: exit 2" test $rc -eq 2
  check "$name: message" grep -qF -- "$pattern" "$tmp/err"
  check "$name: nothing on stdout" test ! -s "$tmp/out"
}
jq '.gear_shifter.up_threshold=0.2' "$src/examples/policies/default.json" >"$tmp/p.json"
expect_error "bad policy" "ftp-plan: error: $tmp/p.json: gear_shifter.up_threshold: must be in (down_threshold, 1] = (0.3, 1], got 0.2" \
  decide --gears "$tmp/gears.json" --policy "$tmp/p.json"
expect_error "policy of the wrong kind" "$tmp/gears.json: kind: expected \"ftp.policy/v1\", got \"ftp.gear-table/v1\"" \
  decide --gears "$tmp/gears.json" --policy "$tmp/gears.json"
expect_error "gears of the wrong kind" "kind: expected \"ftp.gear-table/v1\", got \"ftp.topology/v1\"" decide --gears "$tmp/topo.json"
expect_error "unknown policy name" "ftp-plan: error:" decide --gears "$tmp/gears.json" --policy-name bogus
expect_error "missing --gears" "--gears is required" decide
"$plan" decide --help >"$tmp/out"; rc=$?
check "decide --help: exit 0, lists its options" grep -q -- "--policy-name" "$tmp/out"

# Bash completion offers decide and every option of decide --help.
source "$src/shell/ftp-completion.bash"
COMP_WORDS=(ftp-plan ""); COMP_CWORD=1; COMPREPLY=(); _ftp_plan
check "completion offers decide" grep -qx decide <(printf '%s\n' "${COMPREPLY[@]}")
COMP_WORDS=(ftp-plan decide --); COMP_CWORD=2; COMPREPLY=(); _ftp_plan
for opt in $("$plan" decide --help | grep -oE -- '--[a-z][a-z-]+' | sort -u); do
  check "completion offers decide $opt" grep -qx -- "$opt" <(printf '%s\n' "${COMPREPLY[@]}")
done

finish
