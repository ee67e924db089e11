#!/bin/bash
# Issue 20, item 6 (the README as a front door): the README stays short and
# points at the other documents; benchmark results live in
# docs/benchmarks.md, each with its date, commit, machine and a command; the
# tuning variables the code reads are in a man page, not the README.
set -u
root=$1
fail=0
bad() { echo "check-docs: $*" >&2; fail=1; }

lines=$(wc -l <"$root/README.md")
[ "$lines" -le 150 ] || bad "README.md: $lines lines, over the 150 of a front door (move detail to HACKING.md, docs/ or the man pages)"
for f in HACKING.md docs/benchmarks.md; do
  [ -f "$root/$f" ] || bad "$f: missing"
  grep -q "$f" "$root/README.md" || bad "README.md: does not point at $f"
done

# Every FTP_* variable the library or the tools read is in a man page, and
# none of the backend tuning variables is left in the README.
vars=$(grep -rhoE 'getenv\("FTP_[A-Z0-9_]+"\)' "$root/lib" "$root/tools" | grep -oE 'FTP_[A-Z0-9_]+' | sort -u)
[ -n "$vars" ] || bad "no FTP_* variable found in lib/ or tools/ (did the pattern rot?)"
for v in $vars; do
  grep -q "\*$v\*" "$root"/man/*.scd || bad "$v: read by the code but in no man page"
  case $v in FTP_SOCKET|FTP_API_KEY) ;; *) ! grep -q "$v" "$root/README.md" || bad "README.md: names $v (tuning belongs in ftp-serve(1))" ;; esac
done

# docs/benchmarks.md: each result ("### DATE, commit HASH, MACHINE: ...")
# names a known machine, and its section holds a command in backquotes.
bench=$root/docs/benchmarks.md
results=$(grep -c '^### ' "$bench")
[ "$results" -ge 1 ] || bad "docs/benchmarks.md: no result headings"
head="" cmd=0
check() {
  [ -n "$head" ] || return 0
  [[ $head =~ ^'### '[0-9]{4}-[0-9]{2}-[0-9]{2}', commit '[0-9a-f]{7,40}', '(dev VM|H200) ]] ||
    bad "docs/benchmarks.md: \"$head\": not \"### YYYY-MM-DD, commit HASH, dev VM|H200: ...\""
  [ $cmd -eq 1 ] || bad "docs/benchmarks.md: \"$head\": no command that reproduces it"
}
cmd_re='^(build/|tests/|shell/|meson )|`(build/|tests/|shell/|meson )'
while IFS= read -r line; do
  case $line in
    '### '*) check; head=$line cmd=0 ;;
    '## '*) check; head="" ;;
    *) [[ $line =~ $cmd_re ]] && cmd=1 ;;
  esac
done <"$bench"
check

# The commits named exist (where the repository is at hand).
if git -C "$root" rev-parse --git-dir >/dev/null 2>&1; then
  for h in $(grep -oE '^### [0-9-]+, commit [0-9a-f]+' "$bench" | awk '{print $4}'); do
    git -C "$root" cat-file -e "$h^{commit}" 2>/dev/null || bad "docs/benchmarks.md: commit $h is not in this repository"
  done
fi

[ $fail -eq 0 ] && echo "check-docs: README $lines lines, $results benchmark results, $(echo $vars | wc -w) FTP_* variables documented"
exit $fail
