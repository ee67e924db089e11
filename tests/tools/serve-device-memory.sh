#!/bin/bash
# ftp-serve --device-memory on stories260K's example table: each virtual
# device's memory_weights is its shard union (bytes written out by hand), a
# shift copies nothing and creates no communicator (the pool made them at
# start) and the golden text holds; with performance in release mode, the
# devices that leave it free their copies and the next shift up copies the
# same bytes back (the shift records say how many); a table over
# --virtual-device-memory is refused at start naming the device (exit 2).
set -u
serve=$1; shift_tool=$2; src=$3
source "$(dirname "$0")/common.sh"
need_stories260k
daemon_sandbox
gears=$src/examples/gears/stories260K-cpu.json

rpc() { printf '%s\n' "{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"$1\",\"params\":{}}" | socat -t 10 - "UNIX-CONNECT:$FTP_SOCKET"; }
complete() { curl -s "http://127.0.0.1:$port/v1/completions" -H "Content-Type: application/json" -d "{\"prompt\":\"$1\",\"max_tokens\":$2,\"temperature\":0}"; }

for mode in "" --device-memory; do
  "$serve" -m "$m" --gears "$gears" --virtual-device-memory 600000 $mode --port 0 2>"$tmp/err"; rc=$?
  check "600 kB devices ${mode:-resident}: exit 2" test $rc -eq 2
  check "600 kB devices ${mode:-resident}: device named" grep -qF "the gear table does not fit device vd0: it needs " "$tmp/err"
  check "600 kB devices ${mode:-resident}: bytes free" grep -qF "600000 bytes free" "$tmp/err"
done
"$serve" -m "$m" --gear tp=2 --device-memory -p Zoo 2>"$tmp/err"; rc=$?
check "--device-memory one-shot: exit 2" test $rc -eq 2
check "--device-memory one-shot: why" grep -qF -- "--device-memory: only with the daemon" "$tmp/err"

start_daemon_with "$serve" "$tmp/serve.log" -m "$m" --gears "$gears" --device-memory --step-interval-ms 20
rpc status >"$tmp/status.json"
check "status: device_memory" jq -e '.result.device_memory == true' "$tmp/status.json"
# By hand (stories260K.gguf: F32, untied head, 292800 parameters): vd0,
# vd2, vd3 serve a TP 1 gear, so all of it. vd1 (nested: rank 1 of TP 2,
# rank 2 of TP 4, the pipeline's second stage) holds layers 0-2 at TP 2
# rank 1 (64 x (32 + 16 + 16 + 32 + 86 x 3 + 2) each), layers 3-4 whole
# (64 x 710 each), its vocabulary rows [256, 512) of the embedding
# (vocabulary-parallel: TP 2 rank 1 of a first stage) and, TP 1 of a last
# stage, the whole head with its norm:
# (3 x 22784 + 2 x 45440 + 16384 + 32768 + 64) x 4 bytes.
for d in vd0:1171200 vd1:833792 vd2:1171200 vd3:1171200; do
  check "${d%%:*}: memory_weights ${d#*:}" jq -e --arg d "${d%%:*}" --argjson b "${d#*:}" \
    '.result.devices[] | select(.id==$d) | .memory_weights == $b' "$tmp/status.json"
done
copied=$(jq '.result.weights_copied_bytes' "$tmp/status.json")
golden=$(tail -c +4 "$data/models/stories260K/golden_greedy_t0_prompt_Zoo_steps60.txt")
for g in performance pipelined; do
  "$shift_tool" --to $g --follow >"$tmp/shift.jsonl"; rc=$?
  check "shift to $g: exit 0" test $rc -eq 0
  check "shift to $g: warm copied 0 bytes" grep -q '"message":"1 domain(s) built and warmed; weights copied: 0 bytes;' "$tmp/shift.jsonl"
  check "shift to $g: warm created no communicator" jq -e -s \
    '[.[] | select(.phase=="warm")] | length==1 and .[0].communicators_created==0 and .[0].communicator_ms==0' "$tmp/shift.jsonl"
  check "shift to $g: golden text" test "$(complete Zoo 57 | jq -r '.choices[0].text')" = "$golden"
done
check "status: nothing copied since start" test "$(rpc status | jq '.result.weights_copied_bytes')" = "$copied"
kill "$daemon"; wait "$daemon"; daemon=

# Release mode: vd1, vd2, vd3 leave performance for economy (vd0) and free
# 833792 + 2 x 1171200 bytes (their unions, above); the shift back copies them.
jq '(.gears[] | select(.name=="performance") | .weight_mode) = "release"' "$gears" >"$tmp/release.json"
start_daemon_with "$serve" "$tmp/serve-release.log" -m "$m" --gears "$tmp/release.json" --device-memory --step-interval-ms 20
leaving=$((833792 + 2 * 1171200))
n=0
for g in performance economy performance; do
  n=$((n + 1))
  "$shift_tool" --to $g --follow >"$tmp/shift-$g.jsonl"; rc=$?
  check "release: shift to $g: exit 0" test $rc -eq 0
  check "release: shift to $g: golden text" test "$(complete Zoo 57 | jq -r '.choices[0].text')" = "$golden"
  case $g in
    economy)
      check "release: leaving performance frees $leaving bytes" jq -e -s --argjson b $leaving \
        '[.[] | select(.phase=="retire")][0].weights_released_bytes == $b' "$tmp/shift-$g.jsonl"
      check "release: vd1 holds no weights" test "$(rpc status | jq '.result.devices[] | select(.id=="vd1") | .memory_weights')" = 0 ;;
    performance)
      if [ $n -eq 1 ]; then
        check "release: the first shift up copies nothing" jq -e -s \
          '[.[] | select(.phase=="reserve")][0] | has("weights_copied_bytes") | not' "$tmp/shift-$g.jsonl"
      else
        check "release: the shift up copies $leaving bytes back, timed" jq -e -s --argjson b $leaving \
          '[.[] | select(.phase=="reserve")][0] | .weights_copied_bytes == $b and .weights_copy_ms >= 0' "$tmp/shift-$g.jsonl"
      fi ;;
  esac
done
check "release: vd1 holds its union again" test "$(rpc status | jq '.result.devices[] | select(.id=="vd1") | .memory_weights')" = 833792
kill "$daemon"; wait "$daemon"; daemon=
finish
