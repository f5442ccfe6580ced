# shellcheck shell=bash
# Sourced by the shell tests that drive a real pagoda-server: a temporary
# folder and a server killed on exit, fail() with the server's last log
# lines, and start_server, which starts one on a fresh port and waits until
# the caller's `probe PORT` answers (up to 20 s).
# Expects: $test_name, $server_bin; a function probe.
# shellcheck disable=SC2154  # test_name and server_bin are the caller's
tmp="$(mktemp -d)"
server_pid=""
cleanup() {
  if [ -n "$server_pid" ]; then kill -KILL "$server_pid" 2>/dev/null || true; fi
  rm -rf "$tmp"
}
trap cleanup EXIT

fail() {
  echo "$test_name: FAIL: $*" >&2
  [ -f "$tmp/server.log" ] && tail -n 20 "$tmp/server.log" >&2
  exit 1
}

free_port() {
  python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

# Starts a server (extra flags: "$@") with $server_log_level (warn unless set).
start_server() {
  port="$(free_port)"
  "$server_bin" --listen "127.0.0.1:$port" --metrics-address "" --log-level "${server_log_level:-warn}" "$@" \
    >"$tmp/server.log" 2>&1 &
  server_pid=$!
  for _ in $(seq 1 200); do
    if probe "$port" >/dev/null 2>&1; then
      return 0
    fi
    kill -0 "$server_pid" 2>/dev/null || fail "the server exited at start"
    sleep 0.1
  done
  fail "the server did not answer within 20 s"
}
