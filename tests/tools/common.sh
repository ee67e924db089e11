# Sourced by the shell tests of tests/tools: one way to count checks, end a
# test, and start a private ftp-serve.

pass=0; failn=0

# check NAME COMMAND...: runs COMMAND quietly; counts and reports the result.
check() {
  local name=$1; shift
  if "$@" >/dev/null 2>&1; then pass=$((pass+1)); echo "ok: $name"; else failn=$((failn+1)); echo "FAIL: $name"; fi
}

# finish: the closing line every runner understands, and the exit status.
finish() {
  echo "$pass passed, $failn failed"
  [ "$failn" -eq 0 ]
}

# need_stories260k: sets $data (the test data, FTP_TEST_DATA) and $m (its
# stories260K.gguf), or skips the test (exit 77) with a message where it is absent.
need_stories260k() {
  data=${FTP_TEST_DATA:-}
  m=$data/models/stories260K/stories260K.gguf
  if [ ! -f "$m" ]; then echo "SKIP: stories260K.gguf not found under '$data'"; exit 77; fi
}

# daemon_sandbox: a temp dir $tmp holding the control socket ($FTP_SOCKET);
# on exit the daemon in $daemon (if any) is killed and $tmp removed.
daemon_sandbox() {
  tmp=$(mktemp -d)
  export FTP_SOCKET=$tmp/control.sock
  export STATE_DIRECTORY=$tmp/state  # the shift journal of the daemons it starts
  daemon=
  trap '[ -n "$daemon" ] && kill -9 "$daemon" 2>/dev/null; rm -rf "$tmp"' EXIT
}

# start_daemon_with SERVE LOG ARGS...: starts SERVE ARGS... --port 0 in the
# background with its log in LOG, waits until it listens on HTTP and on
# $FTP_SOCKET; sets $daemon (pid) and $port. Exits 1 with the log if it fails.
start_daemon_with() {
  local serve=$1 log=$2; shift 2
  rm -f "$FTP_SOCKET"
  "$serve" "$@" --port 0 2>"$log" &
  daemon=$!
  port=
  for _ in $(seq 1 200); do
    port=$(sed -n 's/.*http: listening on 127.0.0.1:\([0-9]*\).*/\1/p' "$log" 2>/dev/null)
    [ -n "$port" ] && [ -S "$FTP_SOCKET" ] && return 0
    sleep 0.05
  done
  echo "daemon did not start:"; cat "$log"; exit 1
}

# rpc LINE: one JSON-RPC call on $FTP_SOCKET; prints the answer line.
rpc() { printf '%s\n' "$1" | socat -t 10 - "UNIX-CONNECT:$FTP_SOCKET"; }
