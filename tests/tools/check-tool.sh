#!/bin/bash
# Conventions every tool keeps (STYLE.md): --help on stdout with exit 0,
# --version on stdout with exit 0, an unknown option exits 2 with
# "<tool>: error: ..." on stderr and nothing on stdout, a man page exists.
set -u
tool=$1
man=$2
name=$(basename "$tool")
fail() { echo "FAIL: $name: $*" >&2; exit 1; }
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT

"$tool" --help >"$tmp/out" 2>"$tmp/err"; rc=$?
[ $rc -eq 0 ] || fail "--help exited $rc"
grep -q "Usage" "$tmp/out" || fail "--help printed no usage on stdout"
[ -s "$tmp/err" ] && fail "--help wrote to stderr: $(cat "$tmp/err")"
grep -q -- "--json" "$tmp/out" || fail "--help does not list --json"

"$tool" --version >"$tmp/out" 2>"$tmp/err"; rc=$?
[ $rc -eq 0 ] || fail "--version exited $rc"
grep -Eq "^$name [0-9]+\.[0-9]+\.[0-9]+" "$tmp/out" || fail "--version printed '$(cat "$tmp/out")'"

"$tool" --no-such-option-xyz >"$tmp/out" 2>"$tmp/err"; rc=$?
[ $rc -eq 2 ] || fail "an unknown option exited $rc, expected 2"
grep -q "^$name: error: " "$tmp/err" || fail "usage error not reported as '$name: error: ...': $(cat "$tmp/err")"
[ -s "$tmp/out" ] && fail "usage error wrote to stdout"

"$tool" --json=bogus >"$tmp/out" 2>"$tmp/err"; rc=$?
[ $rc -eq 2 ] || fail "--json=bogus exited $rc, expected 2"

[ -f "$man" ] || fail "no man page $man"
echo "ok: $name conventions"
