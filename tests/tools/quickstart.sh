#!/bin/bash
# shell/quickstart as on a fresh clone without ../shared (issue 19): no test
# data, no FTP_QUICKSTART_MODEL. It must serve the synthetic model the build
# wrote, answer, shift economy -> performance under 8 streams and print a
# shift record that ends done. Usage: quickstart.sh SOURCE_ROOT BUILD_DIR
set -uo pipefail
src=$1 build=$2
source "$(dirname "$0")/common.sh"
empty=$(mktemp -d)
out=$(mktemp)
trap 'rm -rf "$empty" "$out" "$out.err"' EXIT
env -u FTP_QUICKSTART_MODEL FTP_TEST_DATA="$empty" FTP_BUILD="$build" \
  timeout 300 bash "$src/shell/quickstart" >"$out" 2>"$out.err"
rc=$?
cat "$out.err" | sed 's/^/  | /'
check "quickstart exits 0 (rc $rc)" test "$rc" -eq 0
check "it says it serves the synthetic model" grep -q "serving the synthetic model" "$out.err"
check "two completions answered" test "$(grep -c '" ->' "$out.err")" -ge 2
check "the shift record is an ftp.shift-event/v1" jq -e '.kind == "ftp.shift-event/v1"' "$out"
check "the shift reached performance and ended done" jq -e '.phase == "done" and .to == "performance"' "$out"
finish
