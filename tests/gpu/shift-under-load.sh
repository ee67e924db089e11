#!/bin/bash
# Issue 17's daemon checks: ftp-serve with a gear table of TP 1, TP 2 and
# TP 4 (economy, standard, performance) whose ranks are virtual devices
# vd0..vd3 -- on --backend cuda, ranks that share the one GPU (gpu0); on
# --backend cpu, CPU virtual devices with --device-memory -- and SHIFTS
# shifts among them under CLIENTS streaming greedy clients. Prints one
# PASS / FAIL / INFO / N/A line per check (tests/gpu/shift_load.cpp,
# "report") and a closing line "shift-under-load: N passed, N failed".
#
#   - 0 failed requests;
#   - every greedy output equal to a static gear's: before the load the
#     daemon gives one completion at each gear, one gear at a time with no
#     other request (the static gears' texts; they must agree), and with
#     --golden, that text equals llama.cpp's;
#   - the shift records (ftp.shift-event/v1) well formed, every shift
#     committed; warm communicators_created 0 (the pool made them at start);
#   - accept-to-100 % minus the ramp waits (from the records: the 100 %
#     ramp record's t_ms less the reserve record's t_ms - phase_ms, less
#     one --step-interval per ramp record below 100 %), goal <= 1 s,
#     stretch 100 ms; P99 TTFT of the requests whose wait for a first token
#     overlaps an ftp-shift call over that of the others (steady), the
#     steady ones gear-matched as in shift-bench (each gear's weighted by
#     its share of the shifting ones; the pooled ratio and each gear's
#     steady P99 are printed too), goal <= 1.1; with --timings info (the
#     CPU rehearsal) both are printed as INFO, not asserted;
#   - performance is a release-mode gear: the reserve records'
#     weights_copied_bytes / weights_copy_ms where a device had freed its
#     weights (CPU --device-memory); on one GPU every gear keeps gpu0, which
#     the daemon never frees while one of its devices is in use, so there is
#     nothing to copy back and the line says N/A.
#
# usage: tests/gpu/shift-under-load.sh --bin DIR --model GGUF [options]
#   --bin DIR          holds ftp-serve, ftp-shift and shift-load (a device
#                      pack's bin/), or each named by --serve, --shift, --load
#   --backend B        cpu (default) or cuda
#   --shape S          stories260K (default: 5 layers, 8 heads, 4 KV heads)
#                      or llama3-8b (gpu-bench's 8 B: 32, 32, 8)
#   --golden FILE      llama.cpp's greedy text (its first 3 bytes, " Zoo",
#                      are the prompt's) for --prompt Zoo, --max-tokens 57
#   --shifts N         default 20        --clients N     default 16
#   --prompt TEXT      default Zoo       --max-tokens N  default 57
#   --step-interval MS ftp-shift's ramp step (default 50)
#   --steady-ms MS     load before the first shift and after the last (default 3000)
#   --gap-ms MS        steady load between shifts (default 500)
#   --timings assert|info  (default assert)
#   --outputs assert|info  (default assert; info for a model of random
#                      weights, whose near-ties a gear's order of sums may
#                      break either way)
#   --limit S          no step runs past S seconds from the start (default 240)
#   --out DIR          logs and records (default: a temporary folder, removed)
set -u
bin=; serve=; shift_tool=; load_tool=; model=; backend=cpu; shape=stories260K; golden=; shifts=20; clients=16; prompt=Zoo; max_tokens=57
step=50; steady_ms=3000; gap_ms=500; timings=assert; outputs=assert; limit=240; out=
while [ $# -gt 0 ]; do
  case $1 in
    --bin) bin=$2 ;; --serve) serve=$2 ;; --shift) shift_tool=$2 ;; --load) load_tool=$2 ;; --model) model=$2 ;; --backend) backend=$2 ;; --shape) shape=$2 ;; --golden) golden=$2 ;;
    --shifts) shifts=$2 ;; --clients) clients=$2 ;; --prompt) prompt=$2 ;; --max-tokens) max_tokens=$2 ;;
    --step-interval) step=$2 ;; --steady-ms) steady_ms=$2 ;; --gap-ms) gap_ms=$2 ;; --timings) timings=$2 ;; --outputs) outputs=$2 ;;
    --limit) limit=$2 ;; --out) out=$2 ;;
    *) echo "shift-under-load: unknown option $1" >&2; exit 2 ;;
  esac
  shift 2
done
serve=${serve:-$bin/ftp-serve}; shift_tool=${shift_tool:-$bin/ftp-shift}; load_tool=${load_tool:-$bin/shift-load}
[ -n "$model" ] || { echo "shift-under-load: --model is required" >&2; exit 2; }
for p in "$serve" "$shift_tool" "$load_tool"; do
  [ -x "$p" ] || { echo "shift-under-load: $p is not an executable (--bin, --serve, --shift, --load)" >&2; exit 2; }
done
[ -f "$model" ] || { echo "SKIP: shift-under-load: model $model not found"; exit 77; }
case $shape in
  stories260K) layers=5 heads=8 kv_heads=4 hidden=64 ;;
  llama3-8b) layers=32 heads=32 kv_heads=8 hidden=4096 ;;
  *) echo "shift-under-load: --shape: expected stories260K or llama3-8b, got '$shape'" >&2; exit 2 ;;
esac
tmp=$(mktemp -d)
[ -n "$out" ] || out=$tmp/out
mkdir -p "$out"
export FTP_SOCKET=$tmp/control.sock STATE_DIRECTORY=$tmp/state
daemon=; load=
cleanup() {
  [ -n "$load" ] && kill "$load" 2>/dev/null
  [ -n "$daemon" ] && kill -9 "$daemon" 2>/dev/null
  rm -rf "$tmp"
}
trap cleanup EXIT
# Killed by an outer time limit: still stop the daemon (it holds the GPU).
trap 'exit 124' TERM INT
t_start=$SECONDS
left() { echo $((limit - (SECONDS - t_start))); }
# within SECONDS CMD...: CMD under a time limit of SECONDS, cut to what --limit leaves.
within() {
  local s=$1 l; shift
  l=$(left); [ "$s" -gt "$l" ] && s=$l
  [ "$s" -le 0 ] && { echo "shift-under-load: --limit $limit s spent before: $*" >&2; return 124; }
  timeout "$s" "$@"
}
pass=0; failn=0
verdict() {  # OK(0|1) TEXT
  if [ "$1" -eq 0 ]; then pass=$((pass + 1)); echo "PASS: $2"; else failn=$((failn + 1)); echo "FAIL: $2"; fi
}
finish() {
  if [ "$failn" -gt 0 ]; then
    echo "--- the daemon's log (last 30 lines)"; tail -30 "$out/serve.log"
    [ -s "$out/shift.err" ] && { echo "--- ftp-shift's errors"; tail -10 "$out/shift.err"; }
  fi
  echo "shift-under-load ($backend, $shape): $pass passed, $failn failed in $((SECONDS - t_start)) s"
  [ "$failn" -eq 0 ]
  exit
}
ms() { date +%s%3N; }

cat >"$tmp/gears.json" <<EOF
{
  "kind": "ftp.gear-table/v1",
  "comment": "tests/gpu/shift-under-load.sh: TP 1, 2, 4 on vd0..vd3 (on --backend cuda, ranks sharing gpu0); performance releases its weights",
  "model": {"name": "$shape", "n_layers": $layers, "n_heads": $heads, "n_kv_heads": $kv_heads, "hidden_size": $hidden},
  "gears": [
    {"name": "economy", "tp": 1, "pp": 1, "dp": 1,
     "replicas": [{"stages": [{"layers": [0, $layers], "devices": ["vd0"]}]}]},
    {"name": "standard", "tp": 2, "pp": 1, "dp": 1,
     "replicas": [{"stages": [{"layers": [0, $layers], "devices": ["vd0", "vd1"]}]}]},
    {"name": "performance", "tp": 4, "pp": 1, "dp": 1, "weight_mode": "release",
     "replicas": [{"stages": [{"layers": [0, $layers], "devices": ["vd0", "vd1", "vd2", "vd3"]}]}]}
  ]
}
EOF
extra=()
release=copy; release_why=
if [ "$backend" = cpu ]; then
  extra=(--device-memory)
else
  release=none
  release_why="one GPU: every gear keeps a device on gpu0, and the daemon frees a GPU's weights only when none of its devices stays in use"
fi

echo "=== shift-under-load: $backend, $shape ($model), $shifts shifts under $clients clients, step $step ms"
rm -f "$FTP_SOCKET"
"$serve" -m "$model" --gears "$tmp/gears.json" --backend "$backend" --start-gear economy "${extra[@]}" \
  --port 0 2>"$out/serve.log" &
daemon=$!
port=
start_limit=120; [ "$(left)" -lt $start_limit ] && start_limit=$(left)
for _ in $(seq 1 $((start_limit * 10))); do
  port=$(sed -n 's/.*http: listening on 127.0.0.1:\([0-9]*\).*/\1/p' "$out/serve.log" 2>/dev/null)
  [ -n "$port" ] && [ -S "$FTP_SOCKET" ] && break
  kill -0 "$daemon" 2>/dev/null || break
  port=; sleep 0.1
done
verdict "$([ -n "$port" ]; echo $?)" "daemon started on --backend $backend in $((SECONDS - t_start)) s"
[ -n "$port" ] || { tail -20 "$out/serve.log"; finish; }
url=http://127.0.0.1:$port

# The static gears' texts: each gear alone, no other request.
refs=()
for g in economy standard performance; do
  if [ $g != economy ]; then
    within 60 "$shift_tool" --to $g --step-interval "$step" --json=short >>"$out/static-shifts.jsonl" 2>>"$out/shift.err" ||
      { verdict 1 "static shift to $g (see $out/shift.err)"; finish; }
  fi
  within 60 "$load_tool" once --url "$url" --prompt "$prompt" --max-tokens "$max_tokens" >"$out/static-$g.txt"
  verdict $? "static gear $g: a greedy completion ($(wc -c <"$out/static-$g.txt") bytes)"
  refs+=(--reference "$out/static-$g.txt")
done
if [ -n "$golden" ]; then
  if [ -f "$golden" ]; then
    tail -c +4 "$golden" >"$tmp/golden.txt"
    cmp -s "$tmp/golden.txt" "$out/static-economy.txt"
    verdict $? "static gear economy (TP 1) gives llama.cpp's golden text"
  else
    echo "N/A: llama.cpp's golden text: $golden not found"
  fi
fi

# The load, steady, SHIFTS shifts with steady gaps, steady again.
[ "$(left)" -gt 0 ] || { verdict 1 "load: --limit $limit s spent before it"; finish; }
# timeout itself in the background (not a function's subshell), so that
# $load is the process that a kill reaches.
timeout "$(left)" "$load_tool" run --url "$url" --clients "$clients" --prompt "$prompt" --max-tokens "$max_tokens" \
  --stop-file "$tmp/stop" --out "$out/samples.jsonl" --max-seconds "$(left)" &
load=$!
sleep "$(awk -v m="$steady_ms" 'BEGIN {print m / 1000}')"
cycle=(economy standard performance standard economy performance)
gears=performance  # the gear in effect before the first shift, then after each (for the report)
committed=0
: >"$out/windows.txt"; : >"$out/shifts.jsonl"
for s in $(seq 0 $((shifts - 1))); do
  g=${cycle[$((s % ${#cycle[@]}))]}
  t0=$(ms)
  within 60 "$shift_tool" --to "$g" --step-interval "$step" --follow --json=short >>"$out/shifts.jsonl" 2>>"$out/shift.err"
  rc=$?
  echo "$t0 $(ms)" >>"$out/windows.txt"
  # A shift that did not commit leaves the gear as it was.
  now_committed=$(grep -c '"outcome":"committed"' "$out/shifts.jsonl")
  if [ "$now_committed" -gt "$committed" ]; then gears=$gears,$g; else gears=$gears,${gears##*,}; fi
  committed=$now_committed
  [ $rc -eq 124 ] && { verdict 1 "shift $((s + 1)) to $g: timed out"; break; }
  sleep "$(awk -v m="$gap_ms" 'BEGIN {print m / 1000}')"
done
sleep "$(awk -v m="$steady_ms" 'BEGIN {print m / 1000}')"
: >"$tmp/stop"
# The clients end their requests in flight; a hung one is ended after 30 s
# (its request then counts as missing, not as failed: the count below says).
for _ in $(seq 1 300); do kill -0 "$load" 2>/dev/null || break; sleep 0.1; done
if kill -0 "$load" 2>/dev/null; then
  kill "$load"; wait "$load"; load=
  verdict 1 "load: $clients clients still running 30 s after the stop ($(wc -l <"$out/samples.jsonl") requests ended)"
else
  wait "$load"; rc=$?; load=
  verdict $rc "load: $clients clients stopped ($(wc -l <"$out/samples.jsonl") requests)"
fi

within 60 "$load_tool" report --samples "$out/samples.jsonl" --shifts "$out/shifts.jsonl" --windows "$out/windows.txt" \
  "${refs[@]}" --expect-shifts "$shifts" --step-interval "$step" --timings "$timings" --outputs "$outputs" --release-expect "$release" \
  --release-why "$release_why" --gears "$gears" | tee "$out/report.txt"
rc=${PIPESTATUS[0]}
n_pass=$(grep -c '^PASS:' "$out/report.txt" 2>/dev/null); n_fail=$(grep -c '^FAIL:' "$out/report.txt" 2>/dev/null)
pass=$((pass + ${n_pass:-0})); failn=$((failn + ${n_fail:-0}))
[ $rc -eq 0 ] || [ $rc -eq 6 ] || verdict 1 "shift-load report: exit $rc"

kill -TERM "$daemon"; rc=0
for _ in $(seq 1 300); do kill -0 "$daemon" 2>/dev/null || break; sleep 0.1; done
if kill -0 "$daemon" 2>/dev/null; then verdict 1 "SIGTERM: the daemon still runs after 30 s"
else wait "$daemon"; rc=$?; verdict $rc "SIGTERM: the daemon exits $rc"; fi
daemon=
finish
