#!/usr/bin/env bash
# Usage: snapshot_restart_test.sh PAGODA_SERVER PAGODA_CLI
# A real pagoda-server with --snapshot-dir holding sequences is sent SIGTERM,
# started again on the same directory, and every sequence answers as before:
# its lengths, label and decode output (deterministic mode); a new id is
# new; the directory is empty again. Then a migration between two servers
# with pagoda-cli migrate.
set -euo pipefail
server_bin="$(realpath "$1")"
cli_bin="$(realpath "$2")"
tmp="$(mktemp -d)"
pids=()
cleanup() {
  for p in "${pids[@]}"; do { kill -KILL "$p" && wait "$p"; } 2>/dev/null || true; done
  rm -rf "$tmp"
}
trap cleanup EXIT

fail() {
  echo "snapshot_restart_test: FAIL: $*" >&2
  for f in "$tmp"/*.log; do [ -f "$f" ] && tail -n 20 "$f" >&2; done
  exit 1
}

free_port() {
  python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

# start NAME PORT [FLAGS...]: a server in the background; waits until it is SERVING.
start() {
  local name="$1" port="$2"
  shift 2
  "$server_bin" --listen "127.0.0.1:$port" --metrics-address "" --log-level info "$@" >>"$tmp/$name.log" 2>&1 &
  pids+=("$!")
  last_pid=$!
  for _ in $(seq 1 200); do
    if "$cli_bin" --server "127.0.0.1:$port" --timeout-ms 500 health >/dev/null 2>&1; then return 0; fi
    kill -0 "$last_pid" 2>/dev/null || fail "$name exited at start"
    sleep 0.1
  done
  fail "$name did not answer within 20 s"
}

cli() { "$cli_bin" --server "127.0.0.1:$port" "$@"; }
# The answer of a decode without its timing line.
decoded() { cli decode --seq "$1" --layer "$2" --seed 3 --lse | grep -v '^timing'; }

port="$(free_port)"
start first "$port" --snapshot-dir "$tmp/snap"
ids=()
for i in 1 2 3; do
  id="$(cli create --label "seq-$i")"
  cli append --seq "$id" --layer 0 --tokens $((20 * i)) --seed "$i" >/dev/null
  cli append --seq "$id" --layer 1 --tokens $((7 * i)) --seed "$((i + 10))" >/dev/null
  ids+=("$id")
  cli inspect --seq "$id" >"$tmp/before-$id.txt"
  decoded "$id" 0 >>"$tmp/before-$id.txt"
  decoded "$id" 1 >>"$tmp/before-$id.txt"
done
kill -TERM "$last_pid"
wait "$last_pid" || fail "the server exited non-zero after SIGTERM"
[ -f "$tmp/snap/MANIFEST" ] || fail "no MANIFEST after SIGTERM"
grep -q "snapshot: wrote 3 sequences" "$tmp/first.log" || fail "the drain wrote no snapshot"

start second "$port" --snapshot-dir "$tmp/snap"
grep -q "snapshot: restored 3 sequences" "$tmp/second.log" || fail "the start restored no snapshot"
for id in "${ids[@]}"; do
  cli inspect --seq "$id" >"$tmp/after-$id.txt" || fail "sequence $id is gone after the restart"
  decoded "$id" 0 >>"$tmp/after-$id.txt"
  decoded "$id" 1 >>"$tmp/after-$id.txt"
  diff "$tmp/before-$id.txt" "$tmp/after-$id.txt" || fail "sequence $id answers differently after the restart"
done
new="$(cli create)"
for id in "${ids[@]}"; do [ "$new" != "$id" ] || fail "a new id repeats $id"; done
[ -z "$(ls -A "$tmp/snap")" ] || fail "restored files left in the directory: $(ls "$tmp/snap")"

# pagoda-cli migrate: the sequence answers the same on the other server, and is gone here.
other="$(free_port)"
start third "$other" --block-size 32
moved="$("$cli_bin" migrate --server "127.0.0.1:$port" --seq "${ids[2]}" --to "127.0.0.1:$other")" \
  || fail "migrate failed"
port="$other"
cli inspect --seq "$moved" | sed "s/$moved/ID/; s/ [0-9]* blocks//" >"$tmp/moved.txt"
sed "s/${ids[2]}/ID/; s/ [0-9]* blocks//" "$tmp/before-${ids[2]}.txt" | head -n 1 >"$tmp/want.txt"
diff "$tmp/want.txt" "$tmp/moved.txt" || fail "the migrated sequence's lengths or label differ"
decoded "$moved" 0 | sed "s/$moved/ID/" >"$tmp/moved-decode.txt"
sed -n 2,4p "$tmp/before-${ids[2]}.txt" | sed "s/${ids[2]}/ID/" >"$tmp/want-decode.txt"
diff "$tmp/want-decode.txt" "$tmp/moved-decode.txt" || fail "the migrated sequence decodes differently"
echo "snapshot_restart_test: OK"
