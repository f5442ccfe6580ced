#!/usr/bin/env bash
# Usage: shared_memory_bench_test.sh PAGODA_SERVER PAGODA_BENCH
# 1. A server taking requests of at most 64 KiB: a batch-32 Decode (96 KiB of
#    q, k and v in fp32) is refused over the socket, and runs with every call
#    answered with --shared-memory, whose report says so and has its ratios.
# 2. A server without --allow-shared-memory: --shared-memory fails, naming it.
# 3. No shared-memory object of the bench's is left in /dev/shm.
set -euo pipefail
server_bin="$(realpath "$1")"
bench_bin="$(realpath "$2")"
test_name=shared_memory_bench_test
server_log_level=error
probe() {
  "$bench_bin" service --server "127.0.0.1:$1" --mode unary --steps 1 --warmup 0 --no-baseline --no-inprocess
}
# shellcheck source-path=SCRIPTDIR source=../lib/server_harness.sh
source "$(dirname "$0")/../lib/server_harness.sh"

stop_server() {
  kill -TERM "$server_pid"
  wait "$server_pid" || fail "the server exited non-zero after SIGTERM"
  server_pid=""
}

# Objects of other pagoda-bench runs on this host (they are not this test's).
bench_objects() { find /dev/shm -maxdepth 1 -name 'pagoda-bench-*' 2>/dev/null | sort; }
bench_objects >"$tmp/before"

shape=(--batch 32 --context 64 --steps 20 --warmup 2 --rounds 1 --json)

start_server --allow-shared-memory --max-message-bytes 65536
if "$bench_bin" service --server "127.0.0.1:$port" --mode unary "${shape[@]}" >"$tmp/socket.json" 2>&1; then
  fail "a 96 KiB request passed a server taking 64 KiB (the test's premise)"
fi
grep -q "RESOURCE_EXHAUSTED" "$tmp/socket.json" || fail "the socket run failed otherwise: $(tail -n 5 "$tmp/socket.json")"
"$bench_bin" service --server "127.0.0.1:$port" --mode both --shared-memory "${shape[@]}" >"$tmp/shm.json" \
  || fail "the shared-memory run failed: $(tail -n 5 "$tmp/shm.json")"
/usr/bin/python3 - "$tmp/shm.json" <<'PY' || fail "the shared-memory report is wrong: $(cat "$tmp/shm.json")"
import json, sys
r = json.load(open(sys.argv[1]))
assert r["shape"]["shared_memory"] is True, r["shape"]
modes = {m["mode"]: m for m in r["modes"]}
assert set(modes) == {"getconfig", "unary", "stream"}, modes.keys()
for name in ("unary", "stream"):
    m = modes[name]
    assert m["errors"] == 0 and m["calls"] == 20, m
    assert m["p50_over_getconfig"] > 0 and m["service_over_inprocess"] > 0, m
PY
stop_server

start_server
if "$bench_bin" service --server "127.0.0.1:$port" --mode unary --shared-memory "${shape[@]}" >"$tmp/off.txt" 2>&1; then
  fail "--shared-memory ran against a server without --allow-shared-memory"
fi
grep -q "FAILED_PRECONDITION.*--allow-shared-memory" "$tmp/off.txt" \
  || fail "the refusal does not name --allow-shared-memory: $(tail -n 5 "$tmp/off.txt")"
stop_server

bench_objects >"$tmp/after"
left="$(comm -13 "$tmp/before" "$tmp/after")"
[ -z "$left" ] || fail "shared-memory objects left behind: $left"
echo "shared_memory_bench_test: PASS"
