#!/usr/bin/env bash
# Usage: kernel_summary_bench_test.sh PAGODA_BENCH
# pagoda-bench kernel --summary FILE (what `make bench` ends with):
# 1. each run appends one Markdown row per launch, the same launches in the
#    same order as its JSON report, with the same target, dtype, query rows,
#    mode, bound and ratios; the device line and the table's header come once,
#    from the run that found the file empty;
# 2. a file that cannot be appended to is refused at once with exit 2 and a
#    message naming --summary and the path.
set -euo pipefail
bench_bin="$(realpath "$1")"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
fail() { echo "kernel_summary_bench_test: $*" >&2; exit 1; }
common=(--batch 2 --context 96 --q-heads 8 --threads 1 --iters 2 --rounds 1 --no-naive --json --summary "$tmp/s.md")

"$bench_bin" kernel "${common[@]}" --kv-heads 2 --head-dim 64 --dtype fp16,fp8_e4m3 --q-len 1,2 \
  --target best,avx2 --prefetch auto,l2 >"$tmp/a.json" || fail "the first run failed: $(tail -n 5 "$tmp/a.json")"
"$bench_bin" kernel "${common[@]}" --kv-heads 1 --head-dim 576 --v-head-dim 512 --dtype bf16 --window 64 \
  >"$tmp/b.json" || fail "the second run failed: $(tail -n 5 "$tmp/b.json")"
/usr/bin/python3 - "$tmp/s.md" "$tmp/a.json" "$tmp/b.json" <<'PY' || fail "the summary is wrong: $(cat "$tmp/s.md")"
import json, sys
lines = open(sys.argv[1]).read().splitlines()
reports = [json.load(open(p)) for p in sys.argv[2:]]
assert lines[0].startswith(f'{reports[0]["backend"]} on {reports[0]["device"]}'), lines[0]
header = "| target | shape | dtype | q_len | mode | bound | of roof | of read | vs q1 | vs first dtype |"
assert lines.count(header) == 1 and lines[2] == header, lines[:4]
rows = [l for l in lines[4:] if l.startswith("| ")]
assert len(rows) == len(lines) - 4, lines
launches = [(r, x) for r in reports for x in r["rows"]]
assert len(rows) == len(launches), (len(rows), len(launches))

def ratio(v, first=None):
    if v == 0:
        return "-"
    return f"{v:.2f}x" + (f" ({first})" if first else "")

for line, (r, x) in zip(rows, launches):
    cells = [c.strip() for c in line.strip("|").split("|")]
    target, shape, dtype, q_len, mode, bound, roof, read, vs_q1, vs_first = cells
    want_target = x["target"] + (" (best)" if x["selection"] == "best" else "")
    if x["prefetch"] not in ("", "auto"):
        want_target += f', prefetch {x["prefetch"]}'
    assert (target, dtype, int(q_len), mode, bound) == (want_target, x["dtype"], x["q_len"], x["mode"], x["bound"]), (line, x)
    if r["v_head_dim"] < r["head_dim"]:
        heads = f'latent {r["head_dim"]}/{r["v_head_dim"]}, {r["q_heads"]} heads'
    else:
        heads = f'GQA {r["q_heads"] // r["kv_heads"]}, head_dim {r["head_dim"]}'
    want = f'{heads}, {r["batch"]} x {x["context"]}, block {r["block_size"]}'
    if x["window"]:
        want += f', window {x["window"]}'
    assert shape == want, (shape, want)
    # JSON carries four decimals, the table two: the same figure within 0.0051.
    assert abs(float(roof) - x["fraction_of_roofline"]) <= 0.0051, (line, x)
    assert abs(float(read) - x["fraction_of_baseline"]) <= 0.0051, (line, x)
    # The ratios: JSON to three decimals; compare the cells by value too.
    for cell, v in ((vs_q1, x["time_over_q_len_1"]), (vs_first.split(" ")[0], x["time_over_first_dtype"])):
        assert (cell == "-") == (v == 0), (line, x)
        if v:
            assert abs(float(cell.rstrip("x")) - v) <= 0.0051, (line, x)
    if x["time_over_first_dtype"]:
        assert vs_first.endswith(f'({r["rows"][0]["dtype"]})'), line
PY

"$bench_bin" kernel --summary "$tmp/missing/s.md" >"$tmp/bad.out" 2>&1 && fail "--summary into a missing folder was taken"
status=$?
[[ $status -eq 2 ]] || fail "--summary into a missing folder exited $status, expected 2"
grep -q "\-\-summary: expected a file that can be appended to, received '$tmp/missing/s.md'" "$tmp/bad.out" \
  || fail "--summary into a missing folder: $(cat "$tmp/bad.out")"
grep -q "kernel us" "$tmp/bad.out" && fail "--summary into a missing folder ran the launches first"
echo "kernel_summary_bench_test: ok"
