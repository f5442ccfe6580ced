#!/usr/bin/env bash
# Usage: kernel_phases_bench_test.sh PAGODA_BENCH
# pagoda-bench kernel --phases (CPU):
# 1. every row carries its launch's time per kernel phase: the tasks of one
#    launch (one per chunk and KV head here), time in q.k's and P.V's phases,
#    none negative, and how near the peak those two phases ran;
# 2. the table ends in a phases section with a line per row;
# 3. without --phases no row carries phases.
set -euo pipefail
bench_bin="$(realpath "$1")"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
fail() { echo "kernel_phases_bench_test: $*" >&2; exit 1; }

shape=(--batch 2 --context 600 --q-heads 8 --kv-heads 2 --head-dim 64 --threads 1 --iters 2 --rounds 1 --no-naive)
"$bench_bin" kernel "${shape[@]}" --dtype fp16,bf16 --q-len 1,2 --phases --json >"$tmp/run.json" \
  || fail "the run failed: $(tail -n 5 "$tmp/run.json")"
/usr/bin/python3 - "$tmp/run.json" <<'PY' || fail "the report is wrong: $(cat "$tmp/run.json")"
import json, sys
rows = json.load(open(sys.argv[1]))["rows"]
assert len(rows) == 8, len(rows)
for x in rows:
    p = x["phases"]
    # Deterministic mode: 512-token chunks, 600 tokens are two; fast mode one
    # chunk a sequence. Each chunk of each sequence is a task per KV head.
    chunks = 2 if x["mode"] == "deterministic" else 1
    assert p["tasks"] == 2 * chunks * 2, (x["mode"], p)
    for name in ("scores", "softmax", "values", "merge", "other"):
        assert p[name + "_us"] >= 0, (name, p)
    assert p["scores_us"] > 0 and p["values_us"] > 0, p
    assert p["scores_of_peak"] > 0 and p["values_of_peak"] > 0, p
PY

"$bench_bin" kernel "${shape[@]}" --dtype fp16 --phases >"$tmp/table.out" \
  || fail "the table run failed: $(tail -n 5 "$tmp/table.out")"
grep -q '^phases (--phases)' "$tmp/table.out" || fail "no phases section: $(cat "$tmp/table.out")"
lines=$(sed -n '/^phases (--phases)/,$p' "$tmp/table.out" | grep -c ' fp16 ')
[[ $lines -eq 2 ]] || fail "expected a phases line per row (2), found $lines: $(cat "$tmp/table.out")"

"$bench_bin" kernel "${shape[@]}" --dtype fp16 --json >"$tmp/plain.json" \
  || fail "the run without --phases failed: $(tail -n 5 "$tmp/plain.json")"
/usr/bin/python3 -c 'import json, sys; rows = json.load(open(sys.argv[1]))["rows"]; assert rows and not any("phases" in x for x in rows), rows' \
  "$tmp/plain.json" || fail "a row without --phases carries phases: $(cat "$tmp/plain.json")"
echo "kernel_phases_bench_test: ok"
