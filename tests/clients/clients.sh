#!/bin/bash
# Real clients (issue 20): the official openai npm package and
# @langchain/openai against a private ftp-serve on stories260K. The packages
# come from shell/setup's npm cache (outside the repository); without node,
# npm or that cache the test skips with a message.
set -u
serve=$1; src=$2; pending=${3:-}  # checks waiting for another part (clients.mjs)
data=${FTP_TEST_DATA:-}
m=$data/models/stories260K/stories260K.gguf
if [ ! -f "$m" ]; then echo "SKIP: stories260K.gguf not found under '$data'"; exit 77; fi
npm_dir=${FTP_NPM_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/flextp/npm}
if ! command -v node >/dev/null; then echo "SKIP: node is not installed"; exit 77; fi
for p in openai @langchain/openai; do
  if [ ! -d "$npm_dir/node_modules/$p" ]; then
    echo "SKIP: $p not in $npm_dir (run shell/setup with npm and the network)"; exit 77
  fi
done
source "$src/tests/tools/common.sh"
daemon_sandbox
start_daemon_with "$serve" "$tmp/serve.log" -m "$m" --gears "$src/examples/gears/stories260K-cpu.json" --api-key test-key
golden=$(tail -c +4 "$data/models/stories260K/golden_greedy_t0_prompt_Zoo_steps60.txt")
node "$src/tests/clients/clients.mjs" "$npm_dir" "http://127.0.0.1:$port" test-key "$golden" "$pending"; rc=$?
[ $rc -eq 0 ] || { echo "--- daemon log (tail)"; tail -20 "$tmp/serve.log"; }
exit $rc
