#!/usr/bin/env bash
# pagoda's CPU decode against ggml's flash_attn_ext on the same shapes, the
# same threads and fp16 K/V (a report, not a test): one query row at GQA 1, 4
# and 8 and head_dim 64, and four draft rows a sequence (each seeing the keys
# up to its own token, through ggml's mask) at GQA 4. The two take turns for
# ROUNDS rounds and each round gives ggml's median time over pagoda's, so a busy
# neighbour slows both sides of a ratio alike; the median of the rounds is
# reported, with each side's fraction of the shape's roof as pagoda's run
# measured it (the read bandwidth, or the FMA peak where the shape computes more
# than it reads, "bound"): where both run near it, the ratio can be no larger
# than one over ggml's fraction. ggml is not part of pagoda: give a checkout of
# github.com/ggml-org/ggml and its CPU backend is built under build/ggml from it.
#
# Usage: scripts/bench-vs-ggml.sh GGML_SOURCE_DIR [THREADS] [ROUNDS]
set -euo pipefail
usage="usage: scripts/bench-vs-ggml.sh GGML_SOURCE_DIR [THREADS] [ROUNDS]"
src=${1:?$usage}
threads=${2:-2}
rounds=${3:-5}
[[ $threads =~ ^[1-9][0-9]*$ ]] || { echo "bench-vs-ggml: THREADS: expected a positive integer, received '$threads'" >&2; exit 2; }
[[ $rounds =~ ^[1-9][0-9]*$ ]] || { echo "bench-vs-ggml: ROUNDS: expected a positive integer, received '$rounds'" >&2; exit 2; }
root=$(cd "$(dirname "$0")/.." && pwd)
out=$root/build/ggml
[[ -f $src/include/ggml.h ]] || { echo "bench-vs-ggml: $src/include/ggml.h: expected a ggml checkout" >&2; exit 2; }
[[ -x $root/build/client/pagoda-bench ]] || { echo "bench-vs-ggml: build pagoda first (make build)" >&2; exit 2; }

cmake -S "$src" -B "$out" -G Ninja -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=ON -DGGML_BUILD_TESTS=OFF \
  -DGGML_BUILD_EXAMPLES=OFF -DBUILD_SHARED_LIBS=OFF >/dev/null
ninja -C "$out" ggml ggml-cpu ggml-base >/dev/null
gcc -O2 -march=native "$root/bench/ggml/flash_attn_bench.c" -I"$src/include" -o "$out/flash_attn_bench" \
  -Wl,--start-group "$out/src/libggml.a" "$out/src/libggml-cpu.a" "$out/src/libggml-base.a" -Wl,--end-group \
  -lstdc++ -lm -lpthread -fopenmp

# The median of its arguments.
median() { printf '%s\n' "$@" | sort -g | awk '{v[NR] = $1} END {print NR % 2 ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2}'; }

echo "pagoda against ggml flash_attn_ext: fp16 K/V, $threads threads, $rounds rounds"
printf '%-52s %10s %10s %12s %6s %14s %12s\n' shape "ggml us" "pagoda us" "ggml/pagoda" bound "pagoda of roof" "ggml of roof"
# batch context q_heads kv_heads head_dim q_len
for shape in "8 4096 32 32 128 1" "8 4096 32 8 128 1" "8 4096 32 32 64 1" "8 4096 32 4 128 1" "8 4096 32 8 128 4"; do
  read -r batch context heads kv d q_len <<<"$shape"
  name="batch $batch, $context tokens, $heads/$kv heads, d $d, q_len $q_len"
  ratios=()
  roofs=()
  ggml_roofs=()
  for ((round = 1; round <= rounds; ++round)); do
    ggml_us=$("$out/flash_attn_bench" "$batch" "$context" "$heads" "$kv" "$d" "$threads" 30 "$q_len" |
      sed -n 's/.*median \([0-9.]*\) us.*/\1/p')
    json=$("$root/build/client/pagoda-bench" kernel --batch "$batch" --context "$context" --q-heads "$heads" \
      --kv-heads "$kv" --head-dim "$d" --q-len "$q_len" --dtype fp16 --threads "$threads" --block-size 16 --no-naive \
      --mode deterministic --rounds 4 --iters 40 --json)
    pagoda_us=$(grep -o '"kernel_us": [0-9.]*' <<<"$json" | head -1 | awk '{print $2}')
    of_roof=$(grep -o '"fraction_of_roofline": [0-9.]*' <<<"$json" | head -1 | awk '{print $2}')
    bound=$(grep -o '"bound": "[a-z0-9]*"' <<<"$json" | head -1 | awk -F'"' '{print $4}')
    [[ -n $ggml_us && -n $pagoda_us && -n $of_roof && -n $bound ]] ||
      { echo "bench-vs-ggml: $name: a bench printed no figure (ggml '$ggml_us', pagoda '$pagoda_us'," \
          "of roof '$of_roof', bound '$bound')" >&2; exit 1; }
    ratio=$(awk -v g="$ggml_us" -v p="$pagoda_us" 'BEGIN {printf "%.3f", g / p}')
    # ggml's fraction of the same roof: pagoda's, scaled by the two times.
    ggml_of_roof=$(awk -v r="$of_roof" -v g="$ggml_us" -v p="$pagoda_us" 'BEGIN {printf "%.3f", r * p / g}')
    ratios+=("$ratio")
    roofs+=("$of_roof")
    ggml_roofs+=("$ggml_of_roof")
    printf '%-52s %10s %10s %12s %6s %14.3f %12s\n' "$name" "$ggml_us" "$pagoda_us" "$ratio" "$bound" "$of_roof" \
      "$ggml_of_roof"
  done
  printf '%-52s %10s %10s %12.3f %6s %14.3f %12.3f\n' "  median of $rounds rounds" "" "" "$(median "${ratios[@]}")" \
    "$bound" "$(median "${roofs[@]}")" "$(median "${ggml_roofs[@]}")"
done
