#pragma once
// Plain parameter structs handed from the host code to the kernels, and the
// launchers each .cu file exports. Read by both g++ and nvcc: no device code and
// no Status here (the .cu files return cudaError_t; the host code wraps it).

#include <cstdint>
#include <span>

#include <cuda_runtime_api.h>

#include "pagoda/dtype.h"
#include "pagoda/paged_kv.h"

namespace pagoda::cuda {

// A launch's split-KV work, flattened from its DecodePlan (pagoda/decode_plan.h):
// item i is chunk item_chunk[i] of the sequences members[item_members[i] ..
// item_members[i + 1]) (more than one: a shared chunk, equal blocks in all of
// them). Only the chunks some row attends have an item, so a zero-length
// sequence launches nothing. The state of (sequence b, chunk c, row r, query
// head h) is partial row seq_partial[b] + ((c - seq_first_chunk[b]) * rows of
// b + r) * num_q_heads + h: the plan's layout.
struct WorkListView {
  int32_t num_items = 0;
  int32_t chunk_tokens = 0;
  const int32_t* item_chunk = nullptr;       // [num_items] absolute chunk index
  const int32_t* item_members = nullptr;     // [num_items + 1]
  const int32_t* members = nullptr;          // [item_members[num_items]] sequences
  const int32_t* seq_first_chunk = nullptr;  // [batch]
  const int32_t* seq_chunks = nullptr;       // [batch] chunks attended
  const int32_t* seq_partial = nullptr;      // [batch] first partial row
};

// Partial states in fp32: one (m, l, acc) per (item, query row, query head). m
// is base 2 and acc is not normalised (the merge divides by the merged l).
struct PartialStates {
  float* acc = nullptr;  // [partial rows, v_head_dim]
  float* m = nullptr;    // [partial rows]
  float* l = nullptr;    // [partial rows]
};

// The attention variant of a launch (docs/design.md §9), as the kernels read it.
// Sequence b's query rows are [q_indptr[b], q_indptr[b+1]), its last tokens.
struct VariantParams {
  const int32_t* q_indptr = nullptr;  // [batch + 1], always set
  int32_t sliding_window = 0;         // 0: none
  float soft_cap = 0.f;               // 0: none
  float inv_soft_cap = 0.f;           // 1 / soft_cap
  float soft_cap_log2 = 0.f;          // soft_cap * log2(e)
};

struct PartialParams {
  CacheGeometry geometry;
  const void* k_pool = nullptr;  // [layers][blocks][kv_heads][block_size][head_dim]
  const void* v_pool = nullptr;  // same layout as k_pool; null under latent attention (V is K's prefix)
  int32_t layer = 0;
  BatchBlockTables tables;       // device pointers
  WorkListView work;             // device pointers
  VariantParams variant;
  const void* q = nullptr;       // [rows, num_q_heads, head_dim], q_dtype
  DType q_dtype = DType::kFloat32;
  // q's factor: scale * log2(e) (scores in base 2), or scale alone under a
  // soft-cap, whose tanh comes first and soft_cap_log2 after it.
  float q_scale = 0.f;
  PartialStates partials;
};

struct MergeParams {
  int32_t rows = 0;                       // query rows of the launch
  int32_t num_q_heads = 0;
  int32_t head_dim = 0;                   // of V: the partials' and outputs' width
  const int32_t* q_indptr = nullptr;      // [batch + 1]
  const int32_t* row_seq = nullptr;       // [rows] sequence of each row
  const int32_t* seq_chunks = nullptr;    // [batch] chunks attended (WorkListView's)
  const int32_t* seq_partial = nullptr;   // [batch] first partial row (WorkListView's)
  const float* sinks_log2 = nullptr;      // [num_q_heads] sink * log2(e), or null
  const float* acc = nullptr;             // [partial rows, head_dim]
  const float* m = nullptr;               // [partial rows]
  const float* l = nullptr;               // [partial rows]
  void* out = nullptr;                    // [rows, num_q_heads, head_dim], out_dtype
  DType out_dtype = DType::kFloat32;
  float* lse = nullptr;                   // [rows, num_q_heads], natural log
  float out_scale = 1.f;                  // the layer's V scale, folded into 1 / l
};

struct AppendParams {
  CacheGeometry geometry;
  void* k_pool = nullptr;
  void* v_pool = nullptr;
  int32_t layer = 0;
  int32_t num_tokens = 0;
  const int64_t* slots = nullptr;  // [num_tokens] flat slots, validated on the host
  const void* k = nullptr;         // [num_tokens, num_kv_heads, head_dim], in_dtype
  const void* v = nullptr;         // [num_tokens, num_kv_heads, head_dim], in_dtype; null: latent (no V pool)
  DType in_dtype = DType::kFloat32;
  float k_scale = 1.f;             // the cache stores x / scale
  float v_scale = 1.f;
  unsigned long long* saturated = nullptr;  // fp8: elements clamped to the largest finite value
};

// One instantiation of the partial kernel (cache dtype x head_dim).
struct PartialKernel {
  DType cache_dtype;
  int32_t head_dim;
  cudaError_t (*launch)(const PartialParams& p, cudaStream_t stream);
  // Resident CTAs per SM, for the fast split plan's worker count.
  cudaError_t (*ctas_per_sm)(int* ctas);
};

// Each defined in partial_kernels_<dtype>.cu: head_dim 64, 128 and 256.
std::span<const PartialKernel> partial_kernels_fp16();
std::span<const PartialKernel> partial_kernels_bf16();
std::span<const PartialKernel> partial_kernels_fp32();
std::span<const PartialKernel> partial_kernels_fp8();  // e4m3 and e5m2

// merge_kernel.cu: one warp per (query row, query head). rows == 0 launches nothing.
cudaError_t launch_merge(const MergeParams& p, cudaStream_t stream);

// append_kernel.cu: converts in_dtype / scale to the cache dtype (round to
// nearest even; fp8 saturating, pagoda/fp8.h).
cudaError_t launch_append(const AppendParams& p, cudaStream_t stream);

}  // namespace pagoda::cuda
