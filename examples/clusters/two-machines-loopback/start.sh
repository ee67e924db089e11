#!/bin/bash
# One flextp service over three processes on this machine, as it would run
# over two or three machines: a leader (n0) and two members (n1, n2), each
# with 2 CPU virtual devices, on loopback. Ctrl-C ends all three.
#
#   examples/clusters/two-machines-loopback/start.sh [MODEL]
#
# Then: curl localhost:8080/v1/completions -H 'Content-Type: application/json' -d '{"prompt":"Zoo","max_tokens":40}'
#       ftp-shift --to tp2-pp2-over-three --follow
set -eu
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../../.." && pwd)
serve=${FTP_SERVE:-$root/build/tools/ftp-serve}
model=${1:-$root/../shared/data/models/stories260K/stories260K.gguf}
port=${MEMBERS_PORT:-7070}
[ -x "$serve" ] || { echo "no $serve: build first (meson setup build && ninja -C build)"; exit 1; }
[ -f "$model" ] || { echo "no model $model: give its path"; exit 1; }
run=$(mktemp -d)
trap 'kill $(jobs -p) 2>/dev/null; wait; rm -rf "$run"' EXIT INT TERM
# The members' shared secret: mode 0600, or ftp-serve refuses it.
(umask 077; head -c 32 /dev/urandom | base64 >"$run/secret")
"$serve" -m "$model" --gears "$here/gears.json" --virtual-devices 2 \
  --members-listen "127.0.0.1:$port" --secret-file "$run/secret" --socket "$run/control.sock" &
sleep 1
for n in n1 n2; do
  "$serve" -m "$model" --join "127.0.0.1:$port" --secret-file "$run/secret" --name "$n" --virtual-devices 2 &
done
echo "leader on :8080, members n1 n2; control socket $run/control.sock (export FTP_SOCKET=$run/control.sock)"
wait
