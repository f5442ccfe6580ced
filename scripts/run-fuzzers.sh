#!/usr/bin/env bash
# Runs each libFuzzer target of BUILD for its share of RUNS executions, from a
# copy of its seed corpus (the repository's corpus is never written), and
# prints each target's executions and whether it crashed.
#
# Usage: scripts/run-fuzzers.sh BUILD RUNS
set -euo pipefail
build=${1:?usage: run-fuzzers.sh BUILD RUNS}
runs=${2:?usage: run-fuzzers.sh BUILD RUNS}
root=$(cd "$(dirname "$0")/.." && pwd)
targets=(request stream)
per_target=$((runs / ${#targets[@]}))
out="$build/fuzz-out"
mkdir -p "$out"
status=0
for t in "${targets[@]}"; do
  corpus="$out/corpus-$t"
  rm -rf "$corpus"
  cp -r "$root/fuzz/corpus/$t" "$corpus"
  log="$out/$t.log"
  if ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1 \
     "$build/fuzz/${t}_fuzzer" -runs="$per_target" -artifact_prefix="$out/$t-" -print_final_stats=1 \
     "$corpus" >"$log" 2>&1; then
    result="no crash"
  else
    result="CRASH (see $log and $out/$t-*)"
    status=1
  fi
  done_runs=$(grep -Eo 'stat::number_of_executed_units: *[0-9]+' "$log" | grep -Eo '[0-9]+$' || echo "?")
  echo "fuzz $t: $done_runs executions, $result"
done
exit $status
