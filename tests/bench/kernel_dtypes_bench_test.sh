#!/usr/bin/env bash
# Usage: kernel_dtypes_bench_test.sh PAGODA_BENCH
# pagoda-bench kernel --dtype with several caches:
# 1. every requested (dtype, target, q_len, mode) row is reported, each
#    dtype's rows together in the order asked, each dtype on its own cache;
# 2. a later dtype's time_over_first_dtype is its kernel time over the first
#    dtype's row of the same requested target, q_len and mode (recomputed here
#    from the reported times); the first dtype's rows have none;
# 3. a row's time_over_q_len_1 is its kernel time over the one-query-row row
#    of the same dtype, target and mode; with --shared-prefix each variant's
#    forks follow its unshared twins, whose kernel time is their unshared_us;
# 4. a dtype that is not one, or one named twice, is refused with exit 2 and a
#    message naming --dtype, the expected and the received value.
set -euo pipefail
bench_bin="$(realpath "$1")"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
fail() { echo "kernel_dtypes_bench_test: $*" >&2; exit 1; }

"$bench_bin" kernel --batch 2 --context 96 --q-heads 8 --kv-heads 2 --head-dim 64 --dtype fp16,fp8_e4m3,bf16 \
  --target best,avx2 --q-len 1,2 --threads 1 --iters 2 --rounds 1 --no-naive --json >"$tmp/run.json" \
  || fail "the run failed: $(tail -n 5 "$tmp/run.json")"
/usr/bin/python3 - "$tmp/run.json" <<'PY' || fail "the report is wrong: $(cat "$tmp/run.json")"
import json, sys
r = json.load(open(sys.argv[1]))
rows = r["rows"]
want = [(d, t, q, m) for d in ("fp16", "fp8_e4m3", "bf16") for t in ("best", "avx2") for q in (1, 2)
        for m in ("deterministic", "fast")]
got = [(x["dtype"], x["selection"], x["q_len"], x["mode"]) for x in rows]
assert got == want, f"rows {got}, expected {want}"
assert r["dtype"] == "fp16", r["dtype"]
def check_ratio(x, field, base):
    expected = x["kernel_us"] / base
    # Both times are printed to 0.01 us (each off by at most 0.005) and the
    # ratio to 0.001 (off by at most 0.0005): the most the two may differ.
    a = x["kernel_us"]
    slack = max((a + 0.005) / (base - 0.005) - expected, expected - (a - 0.005) / (base + 0.005)) + 0.0005
    assert abs(x[field] - expected) <= slack, (x, field, expected, slack)
    assert x[field] > 0, x

first = {(x["selection"], x["q_len"], x["mode"]): x["kernel_us"] for x in rows if x["dtype"] == "fp16"}
one_row = {(x["dtype"], x["selection"], x["mode"]): x["kernel_us"] for x in rows if x["q_len"] == 1}
for x in rows:
    if x["q_len"] == 1:
        assert x["time_over_q_len_1"] == 0, x
    else:
        check_ratio(x, "time_over_q_len_1", one_row[(x["dtype"], x["selection"], x["mode"])])
    if x["dtype"] == "fp16":
        assert x["time_over_first_dtype"] == 0, x
        continue
    check_ratio(x, "time_over_first_dtype", first[(x["selection"], x["q_len"], x["mode"])])
PY

"$bench_bin" kernel --batch 2 --context 96 --q-heads 8 --kv-heads 2 --head-dim 64 --dtype fp16 --q-len 1,2 \
  --shared-prefix 32 --threads 1 --iters 2 --rounds 1 --no-naive --json >"$tmp/forks.json" \
  || fail "the --shared-prefix run failed: $(tail -n 5 "$tmp/forks.json")"
/usr/bin/python3 - "$tmp/forks.json" <<'PY' || fail "the --shared-prefix report is wrong: $(cat "$tmp/forks.json")"
import json, sys
rows = json.load(open(sys.argv[1]))["rows"]
want = [(q, m, s) for q in (1, 2) for m in ("deterministic", "fast") for s in (0, 32)]
got = [(x["q_len"], x["mode"], x["shared_prefix"]) for x in rows]
assert got == want, f"rows {got}, expected {want}"
for twin, fork in zip(rows[0::2], rows[1::2]):
    assert twin["unshared_us"] == 0, twin
    assert fork["unshared_us"] == twin["kernel_us"], (twin, fork)
PY

"$bench_bin" kernel --dtype fp16,fp7 >"$tmp/bad.out" 2>&1 && fail "--dtype fp7 was taken"
status=$?
[[ $status -eq 2 ]] || fail "--dtype fp7 exited $status, expected 2"
grep -q "\-\-dtype: expected fp32, fp16, bf16, fp8_e4m3 or fp8_e5m2, received 'fp7'" "$tmp/bad.out" \
  || fail "--dtype fp7: $(cat "$tmp/bad.out")"
"$bench_bin" kernel --dtype bf16,bf16 >"$tmp/twice.out" 2>&1 && fail "--dtype bf16,bf16 was taken"
grep -q "\-\-dtype: expected each dtype once, received 'bf16' twice" "$tmp/twice.out" \
  || fail "--dtype bf16,bf16: $(cat "$tmp/twice.out")"
echo "kernel_dtypes_bench_test: ok"
