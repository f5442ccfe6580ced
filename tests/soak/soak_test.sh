#!/usr/bin/env bash
# Usage: soak_test.sh PAGODA_SERVER PAGODA_BENCH
# 1. 16 clients x 400 mixed operations: nothing lost, doubled or mismatched.
# 2. 16 clients under load, SIGTERM after 1 s: no call CANCELLED or failed,
#    the server exits 0 within 5 s of the signal.
# 3. 8 clients with auth on, client 0's token revoked (SIGHUP) mid-run: from
#    then on its calls, its open DecodeStream included, fail UNAUTHENTICATED;
#    the others see nothing and lose, double or mismatch nothing.
set -euo pipefail
server_bin="$(realpath "$1")"
bench_bin="$(realpath "$2")"
test_name=soak_test
probe() { "$bench_bin" soak --server "127.0.0.1:$1" --token "${token:-}" --clients 1 --calls 1; }
# shellcheck source-path=SCRIPTDIR source=../lib/server_harness.sh
source "$(dirname "$0")/../lib/server_harness.sh"

start_server
"$bench_bin" soak --server "127.0.0.1:$port" --clients 16 --calls 400 --deadline-fraction 0.1 --seed 7 \
  | tee "$tmp/soak.txt" || fail "soak found a loss, a duplicate, a mismatch or a failed call"
grep -q "lost 0, duplicates 0" "$tmp/soak.txt" || fail "the soak verified no sequence"
kill -TERM "$server_pid"
wait "$server_pid" || fail "the server exited non-zero after SIGTERM"
server_pid=""

start_server
"$bench_bin" soak --server "127.0.0.1:$port" --clients 16 --calls 1000000 --deadline-fraction 0.1 --seed 8 \
  --sigterm-after 1 --server-pid "$server_pid" | tee "$tmp/drain.txt" \
  || fail "a call failed other than UNAVAILABLE during the drain"
grep -q "SIGTERM sent" "$tmp/drain.txt" || fail "the drain run ended before its SIGTERM"
for _ in $(seq 1 50); do
  kill -0 "$server_pid" 2>/dev/null || break
  sleep 0.1
done
kill -0 "$server_pid" 2>/dev/null && fail "the server still runs 5 s after SIGTERM"
wait "$server_pid" || fail "the server exited non-zero after SIGTERM"
server_pid=""

printf 'ops token-of-ops\nvictim token-of-victim\n' >"$tmp/tokens"
token=token-of-ops start_server --auth-tokens "$tmp/tokens"
"$bench_bin" soak --server "127.0.0.1:$port" --token token-of-ops --clients 8 --calls 1500 --seed 9 \
  --stream-fraction 0.5 --revoke-after 0.5 --revoke-token token-of-victim --tokens-file "$tmp/tokens" \
  --server-pid "$server_pid" | tee "$tmp/revoke.txt" || fail "the revocation run failed (see its table)"
grep -q "token of client 0 revoked" "$tmp/revoke.txt" || fail "the revocation was not sent"
grep -q "after_revocation_stream .* unauthenticated 1" "$tmp/revoke.txt" \
  || fail "the revoked client's DecodeStream was not refused UNAUTHENTICATED"
grep -q "lost 0, duplicates 0" "$tmp/revoke.txt" || fail "the other clients' sequences were not verified"
kill -TERM "$server_pid"
wait "$server_pid" || fail "the server exited non-zero after SIGTERM"
server_pid=""
echo "soak_test: OK"
