#!/usr/bin/env bash
# Usage: convert_bench_test.sh PAGODA_BENCH
# pagoda-bench convert:
# 1. every conversion and scan is reported once per requested target, in order,
#    none flagged as giving other bytes than the element functions, exit 0;
# 2. an element count that is not a tail-free multiple of any vector is timed too;
# 3. a target that is not one is refused, the message naming --target.
set -euo pipefail
bench_bin="$(realpath "$1")"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
fail() { echo "convert_bench_test: $*" >&2; exit 1; }

"$bench_bin" convert --elements 1001 --rounds 3 --target best,avx2 >"$tmp/out" || fail "the run failed: $(cat "$tmp/out")"
grep -q "OUTPUTS DIFFER" "$tmp/out" && fail "a bulk path gave other bytes: $(cat "$tmp/out")"
/usr/bin/python3 - "$tmp/out" <<'PY' || fail "the report is wrong: $(cat "$tmp/out")"
import sys
names = ["fp32 -> fp16", "fp16 -> fp32", "fp32 -> bf16", "bf16 -> fp32", "fp32 -> fp8_e4m3", "fp32 -> fp8_e5m2",
         "scan fp32", "scan fp16", "scan bf16"]
# A row: target, conversion (words), bulk us, element us, speed-up ("12.3x").
rows = []
for line in open(sys.argv[1]):
    t = line.split()
    if len(t) >= 5 and t[-1].endswith("x") and t[0].startswith("AVX"):
        rows.append((t[0], " ".join(t[1:-3]), float(t[-3]), float(t[-2]), float(t[-1][:-1])))
assert [r[1] for r in rows] == names * 2, rows
assert rows[-1][0] == "AVX2", rows[-1]
for target, name, bulk, element, speedup in rows:
    assert bulk >= 0 and element >= 0, (target, name)  # times of a few hundred ns may print as 0.00
PY

set +e
"$bench_bin" convert --target avx9 >"$tmp/bad" 2>&1
code=$?
set -e
[ "$code" -ne 0 ] || fail "--target avx9 was accepted"
grep -q -- "--target" "$tmp/bad" || fail "the refusal does not name --target: $(cat "$tmp/bad")"
echo "convert_bench_test: ok"
