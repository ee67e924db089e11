#!/bin/bash
# The /metrics exposition (issue 20, item 4): promtool check metrics
# passes, and a Prometheus server (Debian's prometheus) scraping a daemon
# during a shift answers queries on the vllm: and flextp: names with data.
# Skips where promtool or prometheus is missing (shell/setup installs them).
set -u
serve=$1; shift_tool=$2; src=$3
if ! command -v promtool >/dev/null; then echo "SKIP: promtool not found (Debian package prometheus)"; exit 77; fi
source "$(dirname "$0")/common.sh"
need_stories260k
daemon_sandbox
start_daemon_with "$serve" "$tmp/serve.log" -m "$m" --gears "$src/examples/gears/stories260K-cpu.json" --step-interval-ms 300
curl -s "http://127.0.0.1:$port/v1/completions" -H "Content-Type: application/json" -d '{"prompt":"Once","max_tokens":8}' >/dev/null
curl -s "http://127.0.0.1:$port/metrics" >"$tmp/metrics.txt"
# promtool's one lint on the vllm: and flextp: names is its convention
# that colons are for recording rules: vLLM's own names carry it, and
# dashboards need them as they are. Any other problem (a parse error, a
# counter without _total, a histogram without +Inf, ...) fails.
promtool check metrics <"$tmp/metrics.txt" >"$tmp/promtool.txt" 2>&1
grep -v "metric names should not contain ':'" "$tmp/promtool.txt" >"$tmp/problems.txt"
check "promtool check metrics: no problem but vLLM's colons" test ! -s "$tmp/problems.txt"
[ -s "$tmp/problems.txt" ] && cat "$tmp/problems.txt"
check "promtool read every family" test "$(grep -c '^# TYPE' "$tmp/metrics.txt")" -ge 20

# The shift dashboard reads only names the daemon exposes.
missing=
for name in $(jq -r '.. | .expr? // empty' "$src/examples/grafana/flextp-shifts.json" | grep -oE '(vllm|flextp):[a-z0-9_]+' | sort -u); do
  grep -q "^$name[{ ]" "$tmp/metrics.txt" || missing="$missing $name"
done
check "grafana dashboard: every metric it reads is exposed" test -z "$missing"
[ -n "$missing" ] && echo "missing:$missing"

prom=$(command -v prometheus)
if [ -z "$prom" ]; then echo "prometheus server not found: its part skipped"; finish; exit; fi
ppt=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
cat >"$tmp/prometheus.yml" <<YML
global: {scrape_interval: 1s, evaluation_interval: 1s}
scrape_configs:
  - job_name: flextp
    static_configs: [{targets: ["127.0.0.1:$port"]}]
YML
"$prom" --config.file="$tmp/prometheus.yml" --storage.tsdb.path="$tmp/tsdb" \
  --web.listen-address="127.0.0.1:$ppt" >"$tmp/prom.log" 2>&1 &
prom_pid=$!
trap '[ -n "$daemon" ] && kill -9 "$daemon" 2>/dev/null; kill "$prom_pid" 2>/dev/null; rm -rf "$tmp"' EXIT
# A shift while it scrapes, with requests on the way.
for i in 1 2 3; do curl -s "http://127.0.0.1:$port/v1/completions" -H "Content-Type: application/json" -d '{"prompt":"Zoo","max_tokens":16}' >/dev/null; done
"$shift_tool" --to standard >/dev/null; check "shift during the scrapes: committed" test $? -eq 0
query() {  # PROMQL: the number of series in the answer
  curl -s "http://127.0.0.1:$ppt/api/v1/query" --data-urlencode "query=$1" | jq '.data.result | length'
}
ok=
for _ in $(seq 1 60); do
  [ "$(query 'vllm:num_requests_running{model_name="stories260K"}' 2>/dev/null)" = 1 ] && \
    [ "$(query 'flextp:shifts_total{outcome="committed"} > 0' 2>/dev/null)" -ge 1 ] 2>/dev/null && { ok=1; break; }
  sleep 0.5
done
check "prometheus: a query on vllm:num_requests_running returns data" test -n "$ok"
check "prometheus: vllm:e2e_request_latency_seconds_count has data" test "$(query 'vllm:e2e_request_latency_seconds_count > 0')" -ge 1
check "prometheus: vllm:time_to_first_token_seconds_bucket has data" test "$(query 'vllm:time_to_first_token_seconds_bucket')" -ge 1
check "prometheus: flextp:shifts_total counts the shift" test "$(query 'flextp:shifts_total{outcome="committed"} > 0')" -ge 1
check "prometheus: the scrape target is up" test "$(query 'up{job="flextp"} == 1')" -eq 1
finish
