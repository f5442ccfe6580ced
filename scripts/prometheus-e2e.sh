#!/usr/bin/env bash
# End-to-end check of the metrics path: a REAL Prometheus (Debian's package) with the
# project's deploy/prometheus/prometheus.yml and alert rules scrapes a real pagoda-server
# on loopback while pagoda-bench drives a short load; the Prometheus HTTP API must then
# show the pagoda series. Everything started here is stopped by pid; every wait is bounded.
#
# Usage: scripts/prometheus-e2e.sh PAGODA_SERVER PAGODA_BENCH [PAGODA_CLI]
set -euo pipefail

if [ "$#" -lt 2 ]; then
  echo "usage: $0 PAGODA_SERVER PAGODA_BENCH [PAGODA_CLI]" >&2
  exit 2
fi
server_bin="$(realpath "$1")"
bench_bin="$(realpath "$2")"
cli_bin="${3:+$(realpath "$3")}"
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
python=/usr/bin/python3  # Debian's: the one with the json module guaranteed, no pyenv

for tool in prometheus curl "$python"; do
  if ! command -v "$tool" >/dev/null 2>&1; then
    echo "prometheus-e2e: missing $tool; run scripts/install-deps.sh checks" >&2
    exit 1
  fi
done

tmp="$(mktemp -d)"
server_pid=""
prometheus_pid=""
cleanup() {
  local pid
  for pid in "$server_pid" "$prometheus_pid"; do
    if [ -n "$pid" ]; then kill -TERM "$pid" 2>/dev/null || true; fi
  done
  for pid in "$server_pid" "$prometheus_pid"; do
    [ -n "$pid" ] || continue
    # Up to 10 s to stop, then SIGKILL.
    for _ in $(seq 1 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    kill -KILL "$pid" 2>/dev/null || true
  done
  rm -rf "$tmp"
}
trap cleanup EXIT

fail() {
  echo "prometheus-e2e: FAIL: $*" >&2
  for log in "$tmp"/*.log; do
    [ -f "$log" ] || continue
    echo "---- last lines of $(basename "$log")" >&2
    tail -n 20 "$log" >&2
  done
  exit 1
}

free_port() {
  "$python" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}
grpc_port="$(free_port)"
metrics_port="$(free_port)"
prometheus_port="$(free_port)"

# The project's scrape config and rules, pointed at this test's server, scraping every second.
mkdir -p "$tmp/config"
cp -r "$root/deploy/prometheus/rules" "$tmp/config/rules"
sed -e "s/127\.0\.0\.1:9464/127.0.0.1:$metrics_port/" \
    -e 's/^\(  *\)scrape_interval: .*/\1scrape_interval: 1s/' \
    -e 's/^\(  *\)evaluation_interval: .*/\1evaluation_interval: 1s/' \
    "$root/deploy/prometheus/prometheus.yml" > "$tmp/config/prometheus.yml"
grep -q "127.0.0.1:$metrics_port" "$tmp/config/prometheus.yml" ||
  fail "deploy/prometheus/prometheus.yml no longer scrapes 127.0.0.1:9464"

"$server_bin" --listen "127.0.0.1:$grpc_port" --metrics-address "127.0.0.1:$metrics_port" \
  --backend cpu --threads 2 --determinism-sample-rate 1 --mode deterministic \
  --log-level warn >"$tmp/pagoda-server.log" 2>&1 &
server_pid=$!
prometheus --config.file="$tmp/config/prometheus.yml" --storage.tsdb.path="$tmp/data" \
  --web.listen-address="127.0.0.1:$prometheus_port" --log.level=warn \
  >"$tmp/prometheus.log" 2>&1 &
prometheus_pid=$!

# wait_for SECONDS DESCRIPTION COMMAND...: polls every 0.2 s.
wait_for() {
  local seconds="$1" what="$2"
  shift 2
  local deadline=$((SECONDS + seconds))
  until "$@" >/dev/null 2>&1; do
    [ "$SECONDS" -lt "$deadline" ] || fail "$what within ${seconds}s"
    kill -0 "$server_pid" 2>/dev/null || fail "pagoda-server exited"
    kill -0 "$prometheus_pid" 2>/dev/null || fail "prometheus exited"
    sleep 0.2
  done
}
wait_for 30 "pagoda-server serves /metrics" curl -sf "http://127.0.0.1:$metrics_port/metrics"
if [ -n "$cli_bin" ]; then
  wait_for 30 "pagoda-server reports SERVING" "$cli_bin" --server "127.0.0.1:$grpc_port" health
fi
wait_for 30 "Prometheus is ready" curl -sf "http://127.0.0.1:$prometheus_port/-/ready"

echo "prometheus-e2e: load: pagoda-bench service against 127.0.0.1:$grpc_port"
timeout 120 "$bench_bin" service --server "127.0.0.1:$grpc_port" --clients 1 --mode both \
  --batch 4 --context 64 --layers 2 --steps 50 --warmup 5 --no-inprocess \
  >"$tmp/pagoda-bench.log" 2>&1 || fail "pagoda-bench service failed"

# query PROMQL: prints the first sample's value, or nothing when the result is empty.
query() {
  curl -sf --get "http://127.0.0.1:$prometheus_port/api/v1/query" --data-urlencode "query=$1" |
    "$python" -c 'import json, sys
r = json.load(sys.stdin)
assert r["status"] == "success", r
res = r["data"]["result"]
print(res[0]["value"][1] if res else "")'
}
positive() { [ "$("$python" -c "import sys; print(float(sys.argv[1] or 0) > 0)" "$(query "$1")")" = True ]; }
present() { [ -n "$(query "$1")" ]; }

# A scrape after the load ended holds its final counts.
wait_for 30 "Prometheus sees Decode calls (pagoda_rpc_duration_seconds_count > 0)" \
  positive 'sum(pagoda_rpc_duration_seconds_count{job="pagoda", method=~"Decode|DecodeStream", code="OK"})'
wait_for 10 "the target is up" positive 'up{job="pagoda"}'
for series in 'pagoda_determinism_checks_total{job="pagoda", mode="deterministic"}' \
              'pagoda_determinism_mismatches_total{job="pagoda", mode="deterministic"}' \
              'pagoda_determinism_max_abs_diff{job="pagoda", mode="deterministic"}' \
              'pagoda_decode_stage_seconds_count{job="pagoda", stage="attention"}' \
              'pagoda_kv_usage_ratio{job="pagoda"}' \
              'pagoda_build_info{job="pagoda"}'; do
  wait_for 10 "Prometheus has $series" present "$series"
done
mismatches="$(query 'sum(pagoda_determinism_mismatches_total{job="pagoda", mode="deterministic"})')"
[ "$mismatches" = "0" ] || fail "deterministic-mode mismatches: $mismatches"

# The alert rules loaded and evaluate without error against real series.
rules_ok() {
  curl -sf "http://127.0.0.1:$prometheus_port/api/v1/rules" | "$python" -c 'import json, sys
rules = [r for g in json.load(sys.stdin)["data"]["groups"] for r in g["rules"]]
assert len(rules) >= 6 and all(r.get("health") == "ok" for r in rules), rules'
}
wait_for 10 "every alert rule evaluates with health ok" rules_ok

# Every dashboard query runs against the real series (Grafana's variables filled in).
"$python" - "$root/deploy/grafana/pagoda-dashboard.json" "http://127.0.0.1:$prometheus_port" <<'PY' ||
import json, re, sys, urllib.parse, urllib.request
dashboard, base = sys.argv[1], sys.argv[2]
def exprs(panels):
    for p in panels:
        yield from (t["expr"] for t in p.get("targets", []) if "expr" in t)
        yield from exprs(p.get("panels", []))
with_data = 0
queries = list(exprs(json.load(open(dashboard))["panels"]))
for expr in queries:
    q = re.sub(r"\$__(rate_interval|range|interval)", "1m", expr).replace("$instance", ".*")
    url = base + "/api/v1/query?" + urllib.parse.urlencode({"query": q})
    reply = json.load(urllib.request.urlopen(url, timeout=10))
    if reply["status"] != "success":
        sys.exit(f"dashboard query failed: {q}: {reply}")
    with_data += bool(reply["data"]["result"])
print(f"prometheus-e2e: {len(queries)} dashboard queries ran, {with_data} with data")
PY
  fail "a dashboard query does not run"

decodes="$(query 'sum(pagoda_rpc_duration_seconds_count{job="pagoda", method=~"Decode|DecodeStream"})')"
checks="$(query 'sum(pagoda_determinism_checks_total{job="pagoda", mode="deterministic"})')"
echo "prometheus-e2e: PASS: Prometheus scraped $decodes Decode calls, $checks determinism checks, 0 mismatches"
