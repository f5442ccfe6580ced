#!/usr/bin/env bash
# The GPU check, run on a machine with an NVIDIA GPU from a bundle made by
# scripts/bundle-gpu.sh: nvidia-smi, the CUDA tests, the kernel benchmark
# (batch 64, contexts 512/2048/8192, 32 query / 8 KV heads, head_dim 128, bf16,
# deterministic and fast), compute-sanitizer over a few test shapes, PyTorch's SDPA on the same shape when torch is there,
# and pagoda-server on the CUDA backend under a short pagoda-bench service load, over the socket and through shared memory.
# Logs and JSON go under OUTDIR; summary.txt lists every step's exit status.
#
#   scripts/gpu-check.sh OUTDIR [BUNDLE_DIR]     (default bundle: build-gpu)
set -uo pipefail

out=${1:?usage: scripts/gpu-check.sh OUTDIR [BUNDLE_DIR]}
bundle=${2:-build-gpu}
bin=$bundle/bin
mkdir -p "$out"
export LD_LIBRARY_PATH="$bundle/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
failed=0

# step NAME SECONDS CMD...: stdout to NAME.out, stderr to NAME.log.
step() {
  local name=$1 seconds=$2
  shift 2
  echo "== $name: $*" | tee -a "$out/summary.txt"
  local start=$SECONDS
  timeout "$seconds" "$@" >"$out/$name.out" 2>"$out/$name.log"
  local rc=$?
  echo "   $name: rc=$rc in $((SECONDS - start)) s" | tee -a "$out/summary.txt"
  ((rc == 0)) || failed=1
  return 0
}

step nvidia-smi 30 nvidia-smi

if [[ -x "$bin/pagoda_cuda_tests" ]]; then
  step cuda-tests 300 "$bin/pagoda_cuda_tests" --gtest_output="json:$out/cuda-tests.json"
  grep -E "^\[  (PASSED|SKIPPED|FAILED) +\] [0-9]+ test" "$out/cuda-tests.out" | tee -a "$out/summary.txt"
  # On a machine with a GPU a skipped CUDA test is a failure: the tests skip
  # only when no device answers, which here means the check did not run them.
  if grep -qE "^\[  SKIPPED \] [1-9][0-9]* test" "$out/cuda-tests.out"; then
    echo "   cuda-tests: tests skipped on a machine with a GPU" | tee -a "$out/summary.txt"
    failed=1
  fi
else
  echo "   cuda-tests: $bin/pagoda_cuda_tests missing from the bundle" | tee -a "$out/summary.txt"
  failed=1
fi

# The kernels under compute-sanitizer on a few shapes: out-of-bounds and
# uninitialised reads (memcheck, initcheck) and shared-memory races (racecheck).
sanitizer=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
if [[ -x "$bin/pagoda_cuda_tests" && -x "$sanitizer" ]]; then
  few='*d256_gqa22_bs5*:*d64_gqa8_bs7_kvfp32_qfp32:*d128_gqa4_bs3_kvbf16_qbf16:*d256_gqa1_bs16_kvfp16_qfp32:*OneKey*:*CudaAppend*:*CudaBlocks*'
  for tool in memcheck racecheck; do
    step "sanitizer-$tool" 300 "$sanitizer" --tool "$tool" --error-exitcode 1 \
      "$bin/pagoda_cuda_tests" --gtest_filter="$few"
  done
  step sanitizer-initcheck 300 "$sanitizer" --tool initcheck --error-exitcode 1 \
    "$bin/pagoda_cuda_tests" --gtest_filter='*d128_gqa4_bs3_kvbf16_qbf16:*OneKey*'
fi

shape=(--batch 64 --q-heads 32 --kv-heads 8 --head-dim 128 --dtype bf16)
if [[ -x "$bin/pagoda-bench" ]]; then
  for mode in deterministic fast; do
    step "kernel-$mode" 240 "$bin/pagoda-bench" kernel --backend cuda "${shape[@]}" \
      --context 512,2048,8192 --mode "$mode" --no-naive --json
  done
fi

# Reference point: torch SDPA over a contiguous cache of the same shape.
if command -v python3 >/dev/null && python3 -c "import torch; assert torch.cuda.is_available()" 2>/dev/null; then
  step torch-sdpa 180 python3 - <<'PY'
import json, torch
import torch.nn.functional as F
res = []
for ctx in (512, 2048, 8192):
    q = torch.randn(64, 32, 1, 128, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(64, 8, ctx, 128, device="cuda", dtype=torch.bfloat16)
    v = torch.randn_like(k)
    kk, vv = k.repeat_interleave(4, dim=1), v.repeat_interleave(4, dim=1)
    for _ in range(3):
        F.scaled_dot_product_attention(q, kk, vv)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times = []
    for _ in range(20):
        start.record(); F.scaled_dot_product_attention(q, kk, vv); end.record()
        torch.cuda.synchronize(); times.append(start.elapsed_time(end) * 1e-3)
    kv_bytes = 2 * k.numel() * k.element_size()
    best = min(times)
    res.append({"context": ctx, "seconds": best, "kv_bytes_per_s": kv_bytes / best,
                "note": "GQA expanded to 32 heads (repeat_interleave): reads 4x the KV bytes counted"})
print(json.dumps({"torch": torch.__version__, "sdpa": res}, indent=1))
PY
fi

if [[ -x "$bin/pagoda-server" && -x "$bin/pagoda-bench" ]]; then
  port=50151
  "$bin/pagoda-server" --backend cuda --listen "127.0.0.1:$port" \
    --metrics-address 127.0.0.1:9565 --layers 4 --q-heads 32 --kv-heads 8 --head-dim 128 \
    --cache-dtype bf16 --block-size 16 --num-blocks 32768 --split-tokens 512 --allow-shared-memory \
    >"$out/server.out" 2>"$out/server.log" &
  server=$!
  for _ in $(seq 60); do
    kill -0 "$server" 2>/dev/null || break
    (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null && break
    sleep 1
  done
  step service 180 "$bin/pagoda-bench" service --server "127.0.0.1:$port" --clients 4 \
    --batch 16 --context 2048 --layers 4 --duration 10 --dtype bf16 --mode both \
    --no-inprocess --json
  # The same load with the tensors in shared memory (docs/design.md §15).
  step service-shm 180 "$bin/pagoda-bench" service --server "127.0.0.1:$port" --clients 4 \
    --batch 16 --context 2048 --layers 4 --duration 10 --dtype bf16 --mode both \
    --no-inprocess --shared-memory --json
  kill -TERM "$server" 2>/dev/null
  for _ in $(seq 40); do kill -0 "$server" 2>/dev/null || break; sleep 1; done
  kill -KILL "$server" 2>/dev/null
  wait "$server"
  echo "   server exit: $?" | tee -a "$out/summary.txt"
fi

echo "gpu-check: $( ((failed)) && echo "some steps failed" || echo "all steps passed"); see $out/summary.txt"
exit "$failed"
