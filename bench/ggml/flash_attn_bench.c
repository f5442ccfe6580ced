// Times ggml's CPU flash_attn_ext on one decode shape for scripts/bench-vs-ggml.sh:
// batch sequences of `context` fp16 K/V, q_len f32 query rows per sequence
// (the last q_len tokens, as draft rows: row i sees the keys up to its own
// position, through ggml's additive f16 mask), the median of `iters` calls.
// Arguments: batch context q_heads kv_heads head_dim threads iters [q_len].
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include "ggml.h"
#include "ggml-cpu.h"

static double now(void) { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec + t.tv_nsec * 1e-9; }
static int cmp(const void* a, const void* b) { double x = *(const double*)a, y = *(const double*)b; return (x > y) - (x < y); }

static int usage(void) {
  fprintf(stderr, "usage: flash_attn_bench batch context q_heads kv_heads head_dim threads iters [q_len]: "
                  "positive integers, kv_heads dividing q_heads, q_len at most context\n");
  return 2;
}

int main(int argc, char** argv) {
  if (argc < 8 || argc > 9) return usage();
  const int batch = atoi(argv[1]), context = atoi(argv[2]), heads = atoi(argv[3]), kv_heads = atoi(argv[4]);
  const int d = atoi(argv[5]), threads = atoi(argv[6]), iters = atoi(argv[7]);
  const int q_len = argc > 8 ? atoi(argv[8]) : 1;
  if (batch < 1 || context < 1 || heads < 1 || kv_heads < 1 || heads % kv_heads != 0 || d < 1 || threads < 1 ||
      iters < 1 || q_len < 1 || q_len > context)
    return usage();
  const size_t kv_bytes = (size_t)2 * batch * context * kv_heads * d * 2;
  const size_t mask_bytes = (size_t)context * q_len * 2;
  struct ggml_init_params p = {kv_bytes + mask_bytes + ((size_t)64 << 20), NULL, false};
  struct ggml_context* ctx = ggml_init(p);
  struct ggml_tensor* q = ggml_new_tensor_4d(ctx, GGML_TYPE_F32, d, q_len, heads, batch);
  struct ggml_tensor* k = ggml_new_tensor_4d(ctx, GGML_TYPE_F16, d, context, kv_heads, batch);
  struct ggml_tensor* v = ggml_new_tensor_4d(ctx, GGML_TYPE_F16, d, context, kv_heads, batch);
  float* qd = (float*)q->data;
  for (int64_t i = 0; i < ggml_nelements(q); ++i) qd[i] = (float)((i * 2654435761u) % 1000) / 1000.f - 0.5f;
  ggml_fp16_t* kd = (ggml_fp16_t*)k->data;
  ggml_fp16_t* vd = (ggml_fp16_t*)v->data;
  for (int64_t i = 0; i < ggml_nelements(k); ++i) {
    kd[i] = ggml_fp32_to_fp16((float)((i * 40503u) % 1000) / 1000.f - 0.5f);
    vd[i] = ggml_fp32_to_fp16((float)((i * 69069u) % 1000) / 1000.f - 0.5f);
  }
  // Row i is token context - q_len + i: it sees keys [0, context - q_len + i].
  struct ggml_tensor* mask = NULL;
  if (q_len > 1) {
    mask = ggml_new_tensor_2d(ctx, GGML_TYPE_F16, context, q_len);
    ggml_fp16_t* md = (ggml_fp16_t*)mask->data;
    for (int i = 0; i < q_len; ++i)
      for (int j = 0; j < context; ++j)
        md[(size_t)i * context + j] = ggml_fp32_to_fp16(j <= context - q_len + i ? 0.f : -INFINITY);
  }
  struct ggml_tensor* out = ggml_flash_attn_ext(ctx, q, k, v, mask, 1.0f / sqrtf((float)d), 0.f, 0.f);
  ggml_flash_attn_ext_set_prec(out, GGML_PREC_DEFAULT);
  struct ggml_cgraph* gf = ggml_new_graph(ctx);
  ggml_build_forward_expand(gf, out);
  ggml_graph_compute_with_ctx(ctx, gf, threads);  // warm-up
  double* t = malloc(sizeof(double) * iters);
  for (int i = 0; i < iters; ++i) {
    const double t0 = now();
    ggml_graph_compute_with_ctx(ctx, gf, threads);
    t[i] = now() - t0;
  }
  qsort(t, iters, sizeof(double), cmp);
  printf("ggml flash_attn_ext: batch %d context %d q_len %d heads %d/%d d %d threads %d: median %.1f us, min %.1f us, "
         "%.2f GB/s\n", batch, context, q_len, heads, kv_heads, d, threads, t[iters / 2] * 1e6, t[0] * 1e6, kv_bytes / t[iters / 2] / 1e9);
  return 0;
}
