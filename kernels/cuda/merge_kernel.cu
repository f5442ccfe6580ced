// The split-KV merge: one warp per (query row, query head) folds the row's
// partial states into one, in chunk order, with the shared merge of
// pagoda/softmax_state.h. Each lane owns 4 consecutive head_dim elements (float4).
//
// The running state starts as the head's sink (m = sink * log2(e), l = 1,
// acc = 0) when sinks are given, else empty; merging a partial into the empty
// state gives that partial's bits exactly, so a one-chunk row takes an exactly
// equivalent path. A row with no key owns no partial: its output is 0
// (inverse_sum(0) = 0) and its LSE -inf, or the sink's.

#include "cuda/device_convert.cuh"
#include "cuda/kernel_params.h"
#include "pagoda/softmax_state.h"

namespace pagoda::cuda {
namespace {

constexpr int kMergeThreads = 32;

__global__ void __launch_bounds__(kMergeThreads) merge_kernel(const MergeParams p) {
  const int row = blockIdx.x / p.num_q_heads;
  const int head = blockIdx.x % p.num_q_heads;
  const int seq = p.row_seq[row];
  const int pos = row - p.q_indptr[seq];
  const int chunks = p.seq_chunks[seq];
  const int rows = p.q_indptr[seq + 1] - p.q_indptr[seq];
  const int64_t out_row = static_cast<int64_t>(row) * p.num_q_heads + head;

  for (int quad = threadIdx.x; quad < p.head_dim / 4; quad += kMergeThreads) {
    SoftmaxState<float, 4> total;
    if (p.sinks_log2 != nullptr) total.stats = {p.sinks_log2[head], 1.f};
    for (int c = 0; c < chunks; ++c) {
      const int64_t src =
          p.seq_partial[seq] + (static_cast<int64_t>(c) * rows + pos) * p.num_q_heads + head;
      SoftmaxState<float, 4> part;
      part.stats = {p.m[src], p.l[src]};
      const float4 a = reinterpret_cast<const float4*>(p.acc + src * p.head_dim)[quad];
      part.acc[0] = a.x;
      part.acc[1] = a.y;
      part.acc[2] = a.z;
      part.acc[3] = a.w;
      total.merge(part);
    }
    const float inv = inverse_sum(total.stats.l) * p.out_scale;
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      store_from_float(p.out, p.out_dtype, out_row * p.head_dim + quad * 4 + k,
                       total.acc[k] * inv);
    }
    if (quad == 0 && p.lse != nullptr) p.lse[out_row] = total.lse();
  }
}

}  // namespace

cudaError_t launch_merge(const MergeParams& p, cudaStream_t stream) {
  if (p.rows == 0 || p.num_q_heads == 0) return cudaSuccess;
  const unsigned ctas = static_cast<unsigned>(p.rows) * static_cast<unsigned>(p.num_q_heads);
  merge_kernel<<<ctas, kMergeThreads, 0, stream>>>(p);
  return cudaGetLastError();
}

}  // namespace pagoda::cuda
