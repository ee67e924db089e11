#!/bin/bash
# The bash completion offers every long option a tool's --help lists.
set -u
src=$1; shift
source "$src/shell/ftp-completion.bash"
bad=0
for tool in "$@"; do
  name=$(basename "$tool")
  fn=$(complete -p "$name" 2>/dev/null | sed -E 's/.*-F ([^ ]+).*/\1/')
  [ -n "$fn" ] || { echo "FAIL: no completion for $name"; bad=1; continue; }
  COMP_WORDS=("$name" "--"); COMP_CWORD=1; COMPREPLY=()
  $fn
  for opt in $("$tool" --help | grep -oE -- '--[a-z][a-z-]+' | sort -u); do
    printf '%s\n' "${COMPREPLY[@]}" | grep -qx -- "$opt" || { echo "FAIL: $name completion lacks $opt"; bad=1; }
  done
done
[ $bad -eq 0 ] && echo "ok: completion covers every option"
exit $bad
