#!/bin/bash
# The folders of lib/ depend one way (lib/meson.build). A folder may include
# headers only from the folders listed for it here (kernels/ is the CUDA ops
# at the top level, used by lib/hardware and the engine's CUDA backend).
set -u
lib=$1
declare -A allowed=(
  [core]="core"
  [doc]="core doc"
  [ipc]="core ipc"
  [hub]="core hub"
  [comm]="core doc comm"
  [hardware]="core doc hardware kernels"
  [http]="core http"
  [serve]="core doc comm hardware model engine member topology ipc control plan sim http serve"
  [member]="core doc comm hardware model engine topology member"
  [api]="core doc comm hardware model engine member topology ipc control plan sim http serve api"
  [engine]="core doc comm hardware model engine kernels"
  [topology]="core doc comm hardware topology"
  [plan]="core doc model plan"
  [control]="core doc control"
  [sim]="core doc model engine plan control sim"
  [model]="core doc model"
  [bench]="core doc control bench"
  [cli]="core doc comm hardware topology ipc plan model control engine member sim serve bench cli"
)
bad=0
for dir in "$lib"/*/; do
  part=$(basename "$dir")
  [ -n "${allowed[$part]+x}" ] || { echo "FAIL: lib/$part has no entry in check-layers.sh"; bad=1; continue; }
  while IFS= read -r line; do
    file=${line%%:*}
    inc=$(sed -E 's/.*#include "([^/"]+)\/.*/\1/' <<<"$line")
    ok=0
    for a in ${allowed[$part]}; do [ "$a" = "$inc" ] && ok=1; done
    [ $ok -eq 1 ] || { echo "FAIL: ${file#$lib/} includes $inc/, not allowed for lib/$part"; bad=1; }
  done < <(grep -rHE '#include "[^/"]+/' "$dir" || true)
done
[ $bad -eq 0 ] && echo "ok: lib/ layers"
exit $bad
