#pragma once
// The split-KV partial kernel: one CTA per (work item, KV head). A work item is
// one chunk of the plan (pagoda/decode_plan.h) with the sequences that read it
// (several when they share the chunk); the CTA streams that chunk's K/V tokens
// of its KV head through shared memory for each query row, and every query
// head of the group reads them from there.
//
// Thread mapping (128 threads): kLanes threads share one token row, each owning
// kVElems consecutive V elements (8 per group, kGroups groups: one 16-byte load
// per group for fp16/bf16, two for fp32); the kSlices rows of lanes are split
// into head groups x token slices. A thread holds kHeadsPerThread query heads
// in registers (q, m, l, acc), so every K/V vector it widens to fp32 is reused
// by that many heads. This is the CUDA-core form of the kernel (no tensor-core
// mma).
//
// Latent attention (docs/design.md §16; head_dim 576, v_head_dim 512): a warp
// of 32 lanes covers the 512 V elements in two groups per lane, and the first
// kTailGroups lanes also own one group of the 64-element RoPE tail of K. There
// is no V pool and no V tile: V is read from the K tile's rows, their first 512
// elements, so each latent row crosses from memory once for both products.
//
// A sequence with n query rows (docs/design.md, "Attention variants") is
// walked row by row in one CTA:
// each row's keys in the chunk are cut to its causal span and sliding window,
// a soft-cap (when set) bends each score before the softmax, and the partial
// goes to the row's own state. A row with no key in the chunk writes the empty
// state, which the merge skips exactly.
//
// Per chunk, row and head the result is the fp32 state (m base 2, l, unnormalised
// acc) of pagoda/softmax_state.h; token slices are merged with merge_into in
// slice order, so the bits depend on the chunk alone, never on the batch.

#include <array>
#include <cstdint>
#include <utility>

#include "cuda/async_copy.cuh"
#include "cuda/device_convert.cuh"
#include "cuda/kernel_params.h"
#include "pagoda/key_ranges.h"
#include "pagoda/softmax_state.h"
#include "pagoda/split_plan.h"
#include "pagoda/vocabulary.h"

namespace pagoda::cuda {

template <typename T, int D>
struct PartialConfig {
  static constexpr int kThreads = 128;
  static constexpr int kDv = v_head_dim_for(D);      // V's width (vocabulary.h)
  static constexpr bool kLatent = kDv < D;           // V is the prefix of K's rows
  static constexpr int kElems = 8;                   // elements per group (one 16-byte load of 16-bit types)
  static constexpr int kLanes = kDv / kElems < 32 ? kDv / kElems : 32;  // threads per token row: 8, 16, 32
  static constexpr int kGroups = kDv / kElems / kLanes;  // V groups per lane: 1, or 2 for 512
  static constexpr int kVElems = kGroups * kElems;       // V (and K prefix) elements per lane
  static constexpr int kTailGroups = (D - kDv) / kElems;  // K's groups past V (RoPE), lanes [0, kTailGroups)
  static constexpr int kQElems = kVElems + (kTailGroups > 0 ? kElems : 0);  // q and K elements per lane
  static constexpr int kSlices = kThreads / kLanes;  // rows of lanes: 16, 8, 4
  static constexpr int kHeadsPerThread = 4;          // query heads blocked in registers
  // Resident CTAs the registers are bounded for: the latent shape holds three
  // times the q and acc registers, and spilling them would cost more than the
  // occupancy.
  static constexpr int kMinBlocks = kLatent ? 2 : 4;
  static constexpr int kRowBytes = D * static_cast<int>(sizeof(T));
  static constexpr int kChunksPerRow = kRowBytes / 16;         // 16-byte copies per row
  // 4 KiB of K per stage, and at least one row per token slice.
  static constexpr int kTileTokens = 4096 / kRowBytes > kSlices ? 4096 / kRowBytes : kSlices;
  static constexpr int kTileBytes = kTileTokens * kRowBytes;   // of K, and again of V unless latent
  static constexpr int kTilesPerStage = kLatent ? 1 : 2;
  // Double buffering: the loop below keeps one tile in flight while it
  // computes the other (cp_async_wait<kStages - 1>).
  static constexpr int kStages = 2;
  static constexpr int kPipelineBytes = kStages * kTilesPerStage * kTileBytes;
  // The slice merge reuses the pipeline's shared memory once the chunk is done.
  static constexpr int kScratchAccFloats = kSlices * kHeadsPerThread * kDv;
  static constexpr int kScratchStatFloats = kSlices * kHeadsPerThread;
  static constexpr int kScratchBytes = (kScratchAccFloats + 2 * kScratchStatFloats) * 4;
  static constexpr int kSmemBytes = kPipelineBytes > kScratchBytes ? kPipelineBytes : kScratchBytes;

  static_assert(kDv % kElems == 0 && kDv / kElems == kGroups * kLanes && 32 % kLanes == 0,
                "lanes must tile a warp and V");
  static_assert((D - kDv) % kElems == 0 && kTailGroups <= kLanes, "K's tail must fit one group per lane");
  static_assert(kRowBytes % 16 == 0, "rows are copied in 16-byte pieces");
  static_assert(kTileTokens >= kSlices, "a tile must give every token slice a row");
  static_assert(kSmemBytes <= 48 * 1024, "static shared memory limit");
};

// How a CTA spreads a group of `group` query heads over its rows of lanes:
// head_groups x token_slices rows are used, `passes` > 1 only when the group is
// larger than kSlices * kHeadsPerThread (the chunk is then streamed again).
struct HeadLayout {
  int head_groups;
  int token_slices;
  int passes;
};

template <int kSlices, int kHeadsPerThread>
__device__ __forceinline__ HeadLayout head_layout(int group) {
  const int head_blocks = (group + kHeadsPerThread - 1) / kHeadsPerThread;
  const int head_groups = head_blocks < kSlices ? head_blocks : kSlices;
  return {head_groups, kSlices / head_groups, (head_blocks + head_groups - 1) / head_groups};
}

// Adds one key (score s in base 2, value v) to a running state. The max only
// moves up, and then what was accumulated is rescaled by the shared
// rescale_factor (0 for the empty state, never exp2(-inf - -inf)).
template <int N>
__device__ __forceinline__ void add_key(SoftmaxStats<float>& st, float (&acc)[N], float s,
                                        const float (&v)[N]) {
  if (s > st.m) {
    const float c = rescale_factor(st.m, s);
    st.l *= c;
#pragma unroll
    for (int e = 0; e < N; ++e) acc[e] *= c;
    st.m = s;
  }
  const float w = exp2_of(s - st.m);
  st.l += w;
#pragma unroll
  for (int e = 0; e < N; ++e) acc[e] += w * v[e];
}

// The elements of a row this lane owns, widened to fp32: its kVElems of the V
// part (from `row`), then, with a tail, its group of K's tail (zeros on lanes
// past kTailGroups). N is kVElems (V) or kQElems (K).
template <typename C, int N, typename T>
__device__ __forceinline__ void widen_lane(const T* row, int lane, float (&dst)[N]) {
  static_assert(N == C::kVElems || N == C::kQElems, "a V or a K lane");
#pragma unroll
  for (int i = 0; i < C::kGroups; ++i) {
    float g8[8];
    widen8(row + lane * C::kVElems + i * 8, g8);
#pragma unroll
    for (int e = 0; e < 8; ++e) dst[i * 8 + e] = g8[e];
  }
  if constexpr (N > C::kVElems) {
    float g8[8] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f};
    if (lane < C::kTailGroups) widen8(row + C::kDv + lane * 8, g8);
#pragma unroll
    for (int e = 0; e < 8; ++e) dst[C::kVElems + e] = g8[e];
  }
}

// This thread's query heads' q (its elements of each of nh heads, times the
// launch's q factor, laid out as widen_lane lays out K) and zeroed
// accumulators; head slots past nh, and tail slots past kTailGroups, hold 0.
template <typename C, int kHB, int D>
__device__ __forceinline__ void load_q(const PartialParams& p, int64_t q_row0, int nh, int lane,
                                       float (&q)[kHB][C::kQElems], float (&acc)[kHB][C::kVElems]) {
#pragma unroll
  for (int j = 0; j < kHB; ++j) {
#pragma unroll
    for (int e = 0; e < C::kQElems; ++e) {
      const bool tail = e >= C::kVElems;
      const int64_t at = tail ? C::kDv + lane * 8 + (e - C::kVElems) : lane * C::kVElems + e;
      const bool mine = j < nh && (!tail || lane < C::kTailGroups);
      q[j][e] = mine ? load_as_float(p.q, p.q_dtype, (q_row0 + j) * D + at) * p.q_scale : 0.f;
    }
#pragma unroll
    for (int e = 0; e < C::kVElems; ++e) acc[j][e] = 0.f;
  }
}

// The base-2 scores of one key row (at k; this lane's widen_lane elements of
// it) for the thread's heads: partial dot products, a butterfly sum over the
// row's lanes (every lane ends with the same bits), then the soft-cap on the
// whole sum, so every lane caps the same bits. Head slots past the group (MHA:
// 3 of 4) are skipped by a CTA-uniform branch, so the shuffles run in whole
// warps; every thread of the warp must call it.
template <typename C, int kHB, typename T>
__device__ __forceinline__ void score_key(const T* k, int lane, const float (&q)[kHB][C::kQElems],
                                          int heads_per_thread, const VariantParams& var, float (&dot)[kHB]) {
  float kf[C::kQElems];
  widen_lane<C>(k, lane, kf);
#pragma unroll
  for (int j = 0; j < kHB; ++j) {
    dot[j] = 0.f;
    if (j >= heads_per_thread) continue;
#pragma unroll
    for (int e = 0; e < C::kQElems; ++e) dot[j] += q[j][e] * kf[e];
  }
#pragma unroll
  for (int offset = C::kLanes / 2; offset > 0; offset /= 2) {
#pragma unroll
    for (int j = 0; j < kHB; ++j) {
      if (j < heads_per_thread) dot[j] += __shfl_xor_sync(0xffffffffu, dot[j], offset);
    }
  }
  if (var.soft_cap > 0.f) {
#pragma unroll
    for (int j = 0; j < kHB; ++j) {
      if (j < heads_per_thread) dot[j] = var.soft_cap_log2 * tanhf(dot[j] * var.inv_soft_cap);
    }
  }
}

// Adds one key (its scores, and this lane's V elements of the value row at v)
// to the online-softmax states of the thread's nh heads.
template <typename C, int kHB, typename T>
__device__ __forceinline__ void update_states(const T* v, int lane, const float (&dot)[kHB], int nh,
                                              SoftmaxStats<float> (&st)[kHB], float (&acc)[kHB][C::kVElems]) {
  float vf[C::kVElems];
  widen_lane<C>(v, lane, vf);
#pragma unroll
  for (int j = 0; j < kHB; ++j) {
    if (j < nh) add_key(st[j], acc[j], dot[j], vf);
  }
}

// Merges the token slices of each head group in slice order through shared
// memory, then token slice 0 stores the states of partial rows row0 + j. All
// copies were waited for (wait_group 0) and a barrier passed, so the scratch
// may alias the pipeline's buffers. Every thread of the CTA calls it.
template <typename C, int kHB>
__device__ __forceinline__ void merge_slices_and_store(unsigned char* smem, bool active, int slice, int token_slice,
                                                       int token_slices, int lane, int nh,
                                                       SoftmaxStats<float> (&st)[kHB], float (&acc)[kHB][C::kVElems],
                                                       const PartialStates& out, int64_t row0) {
  constexpr int kDv = C::kDv;
  constexpr int kE = C::kVElems;
  float* s_acc = reinterpret_cast<float*>(smem);  // [kSlices][kHB][kDv]
  float* s_m = s_acc + C::kScratchAccFloats;      // [kSlices][kHB]
  float* s_l = s_m + C::kScratchStatFloats;       // [kSlices][kHB]
  if (active && token_slice > 0) {
#pragma unroll
    for (int j = 0; j < kHB; ++j) {
      if (j >= nh) continue;
      float* dst = s_acc + (slice * kHB + j) * kDv + lane * kE;
#pragma unroll
      for (int e = 0; e < kE; ++e) dst[e] = acc[j][e];
      if (lane == 0) {
        s_m[slice * kHB + j] = st[j].m;
        s_l[slice * kHB + j] = st[j].l;
      }
    }
  }
  __syncthreads();
  if (!active || token_slice != 0) return;
  for (int other = 1; other < token_slices; ++other) {
    const int os = slice + other;
#pragma unroll
    for (int j = 0; j < kHB; ++j) {
      if (j >= nh) continue;
      const SoftmaxStats<float> o{s_m[os * kHB + j], s_l[os * kHB + j]};
      merge_into(st[j], acc[j], o, s_acc + (os * kHB + j) * kDv + lane * kE, kE);
    }
  }
#pragma unroll
  for (int j = 0; j < kHB; ++j) {
    if (j >= nh) continue;
    const int64_t row = row0 + j;
    float4* dst = reinterpret_cast<float4*>(out.acc + row * kDv + lane * kE);
#pragma unroll
    for (int f = 0; f < kE / 4; ++f) {
      dst[f] = make_float4(acc[j][4 * f], acc[j][4 * f + 1], acc[j][4 * f + 2], acc[j][4 * f + 3]);
    }
    if (lane == 0) {
      out.m[row] = st[j].m;
      out.l[row] = st[j].l;
    }
  }
}

template <typename T, int D>
__global__ void __launch_bounds__(PartialConfig<T, D>::kThreads, PartialConfig<T, D>::kMinBlocks)
    partial_kernel(const PartialParams p) {
  using C = PartialConfig<T, D>;
  constexpr int kHB = C::kHeadsPerThread;
  __shared__ __align__(16) unsigned char smem[C::kSmemBytes];

  const CacheGeometry g = p.geometry;
  const VariantParams& var = p.variant;
  const int item = blockIdx.x;
  const int kv_head = blockIdx.y;
  const int chunk_index = p.work.item_chunk[item];
  // Keys [begin, end) of the query row being computed: the chunk cut to its
  // causal span and window. Lengths are int32, so token indices fit an int;
  // offsets are int64 below.
  int begin = 0;
  int end = 0;
  const int32_t* seq_blocks = nullptr;  // the block table of the member being computed
  const T* k_pool = static_cast<const T*>(p.k_pool);
  const T* v_pool = static_cast<const T*>(p.v_pool);

  const int tid = threadIdx.x;
  const int lane = tid % C::kLanes;
  const int slice = tid / C::kLanes;
  const int group = g.group_size();
  // The layout depends on the group alone, never on the rows: a row's bits are
  // those of the same position decoded as a single row.
  const HeadLayout layout = head_layout<C::kSlices, kHB>(group);
  const int heads_per_thread = group < kHB ? group : kHB;  // the same in every thread
  const int head_group = slice / layout.token_slices;
  const int token_slice = slice % layout.token_slices;

  auto k_stage = [&](int s) { return reinterpret_cast<T*>(smem + s * C::kTilesPerStage * C::kTileBytes); };
  // Latent attention's V is the K tile itself (its rows' first kDv elements).
  auto v_stage = [&](int s) {
    return reinterpret_cast<T*>(smem + s * C::kTilesPerStage * C::kTileBytes + (C::kLatent ? 0 : C::kTileBytes));
  };

  // Each thread copies the same kCopies 16-byte pieces of every tile (of K, and
  // of V unless latent); the last round's pieces past the tile are skipped. The
  // block ids of their rows are read one tile ahead, so the table lookup's
  // latency hides behind a tile of compute; rows past `end` read none.
  constexpr int kPieces = C::kTileTokens * C::kChunksPerRow;
  constexpr int kCopies = (kPieces + C::kThreads - 1) / C::kThreads;
  constexpr int kElemsPerCopy = 16 / static_cast<int>(sizeof(T));
  auto fetch_blocks = [&](int tile_begin, int32_t (&blocks)[kCopies]) {
#pragma unroll
    for (int c = 0; c < kCopies; ++c) {
      const int idx = tid + c * C::kThreads;
      const int t = tile_begin + idx / C::kChunksPerRow;
      blocks[c] = idx < kPieces && t < end ? seq_blocks[t / g.block_size] : 0;
    }
  };
  // Issues the copies of tokens [tile_begin, tile_begin + kTileTokens) that lie
  // before `end`; rows past it are neither read nor written.
  auto load_tile = [&](int stage, int tile_begin, const int32_t (&blocks)[kCopies]) {
    T* k_dst = k_stage(stage);
    T* v_dst = v_stage(stage);
#pragma unroll
    for (int c = 0; c < kCopies; ++c) {
      const int idx = tid + c * C::kThreads;
      const int row = idx / C::kChunksPerRow;
      const int part = idx % C::kChunksPerRow;
      const int t = tile_begin + row;
      if (idx < kPieces && t < end) {
        const int64_t src =
            g.element_offset(p.layer, blocks[c], kv_head, t % g.block_size) + part * kElemsPerCopy;
        const int dst = row * D + part * kElemsPerCopy;
        cp_async_16(k_dst + dst, k_pool + src);
        if constexpr (!C::kLatent) cp_async_16(v_dst + dst, v_pool + src);
      }
    }
    cp_async_commit();
  };

  // Member by member (a shared chunk has several, with equal blocks over it),
  // one query row (position) at a time, its tiles starting at its own first
  // key exactly as a single-row decode's do. The chunk is streamed again for
  // each row; the rows share it, so the repeats can hit L2.
  for (int member = p.work.item_members[item]; member < p.work.item_members[item + 1]; ++member) {
    const int seq = p.work.members[member];
    const int length = p.tables.lengths[seq];
    const int first_row = var.q_indptr[seq];
    const int rows = var.q_indptr[seq + 1] - first_row;
    const ChunkRange chunk = chunk_range(length, p.work.chunk_tokens, chunk_index);
    const int64_t seq_partial =
        p.work.seq_partial[seq] +
        static_cast<int64_t>(chunk_index - p.work.seq_first_chunk[seq]) * rows * g.num_q_heads;
    seq_blocks = p.tables.block_ids + p.tables.block_indptr[seq];
    for (int pos = 0; pos < rows; ++pos) {
      const KeySpan keys = row_keys(length, rows, pos, var.sliding_window);
      begin = static_cast<int>(keys.begin > chunk.begin ? keys.begin : chunk.begin);
      end = static_cast<int>(keys.end < chunk.end ? keys.end : chunk.end);
      if (end < begin) end = begin;
      const int num_tiles = (end - begin + C::kTileTokens - 1) / C::kTileTokens;
      for (int pass = 0; pass < layout.passes; ++pass) {
        // This thread's query heads: local heads [head0, head0 + nh) of the group.
        const int head0 = (pass * layout.head_groups + head_group) * kHB;
        int nh = head_group < layout.head_groups ? group - head0 : 0;
        nh = nh < 0 ? 0 : (nh > kHB ? kHB : nh);
        const bool active = nh > 0;

        float q[kHB][C::kQElems];
        float acc[kHB][C::kVElems];
        SoftmaxStats<float> st[kHB];
        const int64_t q_row0 =
            static_cast<int64_t>(first_row + pos) * g.num_q_heads + kv_head * group + head0;
        load_q<C, kHB, D>(p, q_row0, nh, lane, q, acc);

        int32_t next_blocks[kCopies];  // block ids of the next tile to load
        fetch_blocks(begin, next_blocks);
        if (num_tiles > 0) {
          load_tile(0, begin, next_blocks);
          fetch_blocks(begin + C::kTileTokens, next_blocks);
        }
        for (int it = 0; it < num_tiles; ++it) {
          const int tile_begin = begin + it * C::kTileTokens;
          if (it + 1 < num_tiles) {
            load_tile((it + 1) % C::kStages, tile_begin + C::kTileTokens, next_blocks);
            fetch_blocks(tile_begin + 2 * C::kTileTokens, next_blocks);
            cp_async_wait<C::kStages - 1>();
          } else {
            cp_async_wait<0>();
          }
          __syncthreads();

          const T* k_tile = k_stage(it % C::kStages);
          const T* v_tile = v_stage(it % C::kStages);
          // Every thread runs the same number of steps: the shuffles below need the
          // whole warp. Rows past the tile or the length are computed on a clamped
          // row and then dropped (by branch, never by multiplying by 0).
          for (int r0 = 0; r0 < C::kTileTokens; r0 += layout.token_slices) {
            const int r_raw = r0 + token_slice;
            const int r = r_raw < C::kTileTokens ? r_raw : C::kTileTokens - 1;
            const bool valid = active && r_raw < C::kTileTokens && tile_begin + r < end;

            float dot[kHB];
            score_key<C, kHB>(k_tile + r * D, lane, q, heads_per_thread, var, dot);
            if (valid) update_states<C, kHB>(v_tile + r * D, lane, dot, nh, st, acc);
          }
          __syncthreads();  // the stage is overwritten by the next iteration's copies
        }

        const int64_t row0 = seq_partial + static_cast<int64_t>(pos) * g.num_q_heads + kv_head * group + head0;
        merge_slices_and_store<C, kHB>(smem, active, slice, token_slice, layout.token_slices, lane, nh, st, acc,
                                       p.partials, row0);
        __syncthreads();  // the next pass or row reuses the shared memory
      }
    }
  }
}

template <typename T, int D>
cudaError_t launch_partial(const PartialParams& p, cudaStream_t stream) {
  if (p.work.num_items == 0) return cudaSuccess;
  const dim3 grid(static_cast<unsigned>(p.work.num_items),
                  static_cast<unsigned>(p.geometry.num_kv_heads));
  partial_kernel<T, D><<<grid, PartialConfig<T, D>::kThreads, 0, stream>>>(p);
  return cudaGetLastError();
}

template <typename T, int D>
cudaError_t partial_ctas_per_sm(int* ctas) {
  return cudaOccupancyMaxActiveBlocksPerMultiprocessor(ctas, partial_kernel<T, D>,
                                                       PartialConfig<T, D>::kThreads, 0);
}

// The instances of one cache element type: one per head dim of the
// vocabulary (pagoda/vocabulary.h), so a new head dim needs no edit here.
template <typename T, size_t... I>
constexpr std::array<PartialKernel, sizeof...(I)> partial_instances(DType dtype, std::index_sequence<I...>) {
  return {{PartialKernel{dtype, kHeadDims[I], &launch_partial<T, kHeadDims[I]>,
                         &partial_ctas_per_sm<T, kHeadDims[I]>}...}};
}

template <typename T>
constexpr auto partial_instances(DType dtype) {
  return partial_instances<T>(dtype, std::make_index_sequence<kHeadDims.size()>{});
}

template <size_t N, size_t M>
constexpr std::array<PartialKernel, N + M> concat(const std::array<PartialKernel, N>& a,
                                                  const std::array<PartialKernel, M>& b) {
  std::array<PartialKernel, N + M> out{};
  for (size_t i = 0; i < N; ++i) out[i] = a[i];
  for (size_t i = 0; i < M; ++i) out[N + i] = b[i];
  return out;
}

}  // namespace pagoda::cuda
