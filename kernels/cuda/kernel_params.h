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

// A launch's split-KV work as a flat list: item i is chunk item_chunk[i] of
// sequence item_seq[i]. Items of sequence b are [item_indptr[b], item_indptr[b+1])
// in chunk order, so a zero-length sequence owns no item and launches nothing.
struct WorkListView {
  int32_t num_items = 0;
  int32_t chunk_tokens = 0;
  const int32_t* item_seq = nullptr;     // [num_items]
  const int32_t* item_chunk = nullptr;   // [num_items]
  const int32_t* item_indptr = nullptr;  // [batch + 1]
};

// Partial states in fp32: one (m, l, acc) per (item, query head). m is base 2 and
// acc is not normalised (the merge divides by the merged l).
struct PartialStates {
  float* acc = nullptr;  // [num_items, num_q_heads, head_dim]
  float* m = nullptr;    // [num_items, num_q_heads]
  float* l = nullptr;    // [num_items, num_q_heads]
};

struct PartialParams {
  CacheGeometry geometry;
  const void* k_pool = nullptr;  // [layers][blocks][kv_heads][block_size][head_dim]
  const void* v_pool = nullptr;  // same layout as k_pool
  int32_t layer = 0;
  BatchBlockTables tables;       // device pointers
  WorkListView work;             // device pointers
  const void* q = nullptr;       // [batch, num_q_heads, head_dim], q_dtype
  DType q_dtype = DType::kFloat32;
  float scale_log2 = 0.f;        // softmax scale * log2(e)
  PartialStates partials;
};

struct MergeParams {
  int32_t batch = 0;
  int32_t num_q_heads = 0;
  int32_t head_dim = 0;
  const int32_t* item_indptr = nullptr;  // [batch + 1]
  const float* acc = nullptr;            // [num_items, num_q_heads, head_dim]
  const float* m = nullptr;              // [num_items, num_q_heads]
  const float* l = nullptr;              // [num_items, num_q_heads]
  void* out = nullptr;                   // [batch, num_q_heads, head_dim], out_dtype
  DType out_dtype = DType::kFloat32;
  float* lse = nullptr;                  // [batch, num_q_heads], natural log
};

struct AppendParams {
  CacheGeometry geometry;
  void* k_pool = nullptr;
  void* v_pool = nullptr;
  int32_t layer = 0;
  int32_t num_tokens = 0;
  const int64_t* slots = nullptr;  // [num_tokens] flat slots, validated on the host
  const void* k = nullptr;         // [num_tokens, num_kv_heads, head_dim], in_dtype
  const void* v = nullptr;         // [num_tokens, num_kv_heads, head_dim], in_dtype
  DType in_dtype = DType::kFloat32;
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

// merge_kernel.cu: one CTA per (sequence, query head). batch == 0 launches nothing.
cudaError_t launch_merge(const MergeParams& p, cudaStream_t stream);

// append_kernel.cu: converts in_dtype to the cache dtype (round to nearest even).
cudaError_t launch_append(const AppendParams& p, cudaStream_t stream);

}  // namespace pagoda::cuda
