#!/usr/bin/env bash
# pagoda's CPU decode against ggml's flash_attn_ext on the same shapes, the
# same threads and fp16 K/V, each pair timed back to back (a report, not a
# test). ggml is not part of pagoda: give a checkout of github.com/ggml-org/ggml
# and its CPU backend is built under build/ggml from it.
#
# Usage: scripts/bench-vs-ggml.sh GGML_SOURCE_DIR [THREADS]
set -euo pipefail
src=${1:?usage: scripts/bench-vs-ggml.sh GGML_SOURCE_DIR [THREADS]}
threads=${2:-2}
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

# batch context q_heads kv_heads head_dim
for shape in "8 4096 32 32 128" "8 4096 32 8 128" "8 4096 32 32 64"; do
  read -r batch context heads kv d <<<"$shape"
  "$out/flash_attn_bench" "$batch" "$context" "$heads" "$kv" "$d" "$threads" 30
  "$root/build/client/pagoda-bench" kernel --batch "$batch" --context "$context" --q-heads "$heads" \
    --kv-heads "$kv" --head-dim "$d" --dtype fp16 --threads "$threads" --block-size 16 --no-naive \
    --mode deterministic --rounds 4 --iters 40 | grep -E '^ *(target|AVX)'
done
