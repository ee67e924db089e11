#!/bin/bash
# Issue 20, hostile input, against a live ftp-serve --engine sim (no
# weights): JSON past the parser's limits over HTTP and the control socket
# (item 1), the memory of a 16 MB body of [] pairs (item 4), a socket
# squatted by another user (item 7), reload outside the config directory and
# without echoing a file's bytes, the test hook outside test mode and a
# 30-digit JSON-RPC id (item 8).
set -u
tools=$1; src=$2
source "$(dirname "$0")/common.sh"
daemon_sandbox
# The config directory: the gear table's.
mkdir -p "$tmp/etc"
"$tools/ftp-probe" --cluster "$src/examples/clusters/a100-8x-nvlink.json" >"$tmp/topo.json"
"$tools/ftp-plan" --topology "$tmp/topo.json" --model "$src/examples/models/llama-70b.json" >"$tmp/etc/gears.json"
gear=$(jq -r '.gears[1].name' "$tmp/etc/gears.json")
start_daemon_with "$tools/ftp-serve" "$tmp/serve.log" --engine sim -m "$src/examples/models/llama-70b.json" \
  --topology "$tmp/topo.json" --gears "$tmp/etc/gears.json" --step-interval-ms 0
# rpc LINE: one request on the control socket, its answer line as sent.
keys() { jq -cn --argjson n "$1" '[range($n)] | map({key: "k\(.)", value: 0}) | from_entries'; }

# Item 1: 80,000 keys in one object, refused by the key limit while parsing.
keys 80000 >"$tmp/keys.json"
curl -s -o "$tmp/keys.out" -w '%{http_code}' "http://127.0.0.1:$port/v1/completions" \
  -H 'Content-Type: application/json' --data-binary @"$tmp/keys.json" >"$tmp/code"
check "1: 80,000 keys over HTTP: 400" test "$(cat "$tmp/code")" = 400
check "1: 80,000 keys over HTTP: the limit named" grep -q 'more than 4096 keys' "$tmp/keys.out"
rpc "{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"status\",\"params\":$(cat "$tmp/keys.json")}" >"$tmp/keys.rpc"
check "1: 80,000 keys on the control socket: ParseError max_keys" \
  jq -e '.error.data.name == "ftp.ParseError" and .error.data.limit == "max_keys"' "$tmp/keys.rpc"
check "1: the daemon serves on" jq -e '.result.kind == "ftp.status/v1"' <(rpc '{"jsonrpc":"2.0","id":2,"method":"status"}')

# Item 4: a 16 MB body of [] pairs grows the daemon's peak RSS by at most 4x
# its size (375 MB before): refused at kMaxValues while parsing.
python3 -c 'import sys; sys.stdout.write("[" + "[],"*5333333 + "[]]")' >"$tmp/pairs.json"
size=$(stat -c %s "$tmp/pairs.json")
rss_kb() { awk -v k="$1" '$1 == k":" {print $2}' "/proc/$daemon/status"; }
before=$(rss_kb VmRSS)
curl -s -o "$tmp/pairs.out" -w '%{http_code}' "http://127.0.0.1:$port/v1/completions" \
  -H 'Content-Type: application/json' --data-binary @"$tmp/pairs.json" >"$tmp/code"
peak=$(rss_kb VmHWM)
growth=$(( (peak - before) * 1024 ))
echo "4: $size-byte body of [] pairs: peak RSS $((before / 1024)) MB before, $((peak / 1024)) MB peak, growth $((growth / 1048576)) MB = $(awk -v g="$growth" -v s="$size" 'BEGIN {printf "%.2f", g / s}')x the body"
check "4: [] pairs: 400 naming the value limit" grep -q 'more than 524288 values' "$tmp/pairs.out"
check "4: [] pairs: peak RSS growth <= 4x the body" test "$growth" -le $((4 * size))

# Item 8: the test hook is refused outside test mode.
"$tools/ftp-shift" --to "$gear" --inject-fault check 2>"$tmp/err"; rc=$?
check "8: inject_fault without --enable-test-hooks: exit 2" test $rc -eq 2
check "8: inject_fault: names --enable-test-hooks" grep -q 'enable-test-hooks' "$tmp/err"

# Item 8: reload reads only below the config directory and never quotes a file.
rpc '{"jsonrpc":"2.0","id":3,"method":"reload","params":{"path":"/etc/shadow"}}' >"$tmp/shadow.rpc"
check "8: reload /etc/shadow: refused, outside the config directory" \
  jq -e '.error.data.name == "ftp.InvalidGearTable" and (.error.message | test("outside the config directory"))' "$tmp/shadow.rpc"
check "8: reload /etc/shadow: no byte of it" bash -c "! grep -q 'root:' '$tmp/shadow.rpc'"
ln -s /etc/shadow "$tmp/etc/link.json"
rpc '{"jsonrpc":"2.0","id":4,"method":"reload","params":{"path":"link.json"}}' >"$tmp/link.rpc"
check "8: reload of a symlink out of the config directory: refused" \
  jq -e '.error.message | test("outside the config directory")' "$tmp/link.rpc"
printf 'SECRET-BYTES: not json\n' >"$tmp/etc/secret.json"
rpc '{"jsonrpc":"2.0","id":5,"method":"reload","params":{"path":"secret.json"}}' >"$tmp/secret.rpc"
check "8: reload of a file that is not JSON: line and column" jq -e '.error.message | test("line 1, column 1: malformed JSON")' "$tmp/secret.rpc"
check "8: reload of a file that is not JSON: no byte of it" bash -c "! grep -q SECRET '$tmp/secret.rpc'"
check "8: reload of the gear table by name: accepted" jq -e '.result.current' \
  <(rpc '{"jsonrpc":"2.0","id":6,"method":"reload","params":{"path":"gears.json"}}')

# Item 8: a 30-digit id comes back exactly.
rpc '{"jsonrpc":"2.0","id":123456789012345678901234567890,"method":"status"}' >"$tmp/id.rpc"
check "8: a 30-digit id comes back exactly" grep -q '^{"jsonrpc":"2.0","id":123456789012345678901234567890,"result"' "$tmp/id.rpc"

# Item 7: a socket squatted by another user is refused by the tools (exit 3,
# naming the owner).
if [ "$(id -u)" -ne 0 ] || ! command -v setpriv >/dev/null; then
  echo "SKIP (item 7): needs root and setpriv to listen as another user"
else
  # Outside $tmp (mode 0700), where the other user can reach it.
  sq=$(mktemp -d /tmp/ftp-squat-XXXXXX)
  chmod 1777 "$sq"
  setpriv --reuid=nobody --regid=nogroup --clear-groups socat "UNIX-LISTEN:$sq/control.sock,fork" /dev/null &
  squatter=$!
  for _ in $(seq 1 100); do [ -S "$sq/control.sock" ] && break; sleep 0.05; done
  for t in "ftp-shift --to $gear" "ftp-drain --domain d0" "ftp-probe --watch --count 1"; do
    FTP_SOCKET=$sq/control.sock "$tools"/$t >/dev/null 2>"$tmp/err"; rc=$?
    check "7: ${t%% *} at a squatted socket: exit 3" test $rc -eq 3
    check "7: ${t%% *} at a squatted socket: names the owner" grep -q 'served by uid 65534 (nobody)' "$tmp/err"
  done
  kill "$squatter" 2>/dev/null; wait "$squatter" 2>/dev/null
  rm -rf "$sq"
fi

kill -TERM "$daemon"; wait "$daemon"; rc=$?; daemon=
check "SIGTERM: exit 0" test $rc -eq 0
finish
