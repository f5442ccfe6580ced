// Times ggml's CPU flash_attn_ext on one decode shape for scripts/bench-vs-ggml.sh:
// batch sequences of `context` fp16 K/V, one f32 query row per sequence, the
// median of `iters` calls. Arguments: batch context q_heads kv_heads head_dim threads iters.
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include "ggml.h"
#include "ggml-cpu.h"

static double now(void) { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec + t.tv_nsec * 1e-9; }
static int cmp(const void* a, const void* b) { double x = *(const double*)a, y = *(const double*)b; return (x > y) - (x < y); }

int main(int argc, char** argv) {
  const int batch = atoi(argv[1]), context = atoi(argv[2]), heads = atoi(argv[3]), kv_heads = atoi(argv[4]);
  const int d = atoi(argv[5]), threads = atoi(argv[6]), iters = atoi(argv[7]);
  const size_t kv_bytes = (size_t)2 * batch * context * kv_heads * d * 2;
  struct ggml_init_params p = {kv_bytes + ((size_t)64 << 20), NULL, false};
  struct ggml_context* ctx = ggml_init(p);
  struct ggml_tensor* q = ggml_new_tensor_4d(ctx, GGML_TYPE_F32, d, 1, heads, batch);
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
  struct ggml_tensor* out = ggml_flash_attn_ext(ctx, q, k, v, NULL, 1.0f / 11.3137f, 0.f, 0.f);
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
  printf("ggml flash_attn_ext: batch %d context %d heads %d/%d d %d threads %d: median %.1f us, min %.1f us, %.2f GB/s\n",
         batch, context, heads, kv_heads, d, threads, t[iters / 2] * 1e6, t[0] * 1e6, kv_bytes / t[iters / 2] / 1e9);
  return 0;
}
