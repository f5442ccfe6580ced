#pragma once
// The flat work list of a decode launch, built on the host: one item per
// (sequence, chunk some query row of it attends), sequence-major and in chunk
// order, so short sequences launch no empty chunks, chunks outside every row's
// window launch nothing, and the merge finds a sequence's partials contiguous.

#include <cstdint>
#include <span>

#include "pagoda/backend.h"

namespace pagoda::cuda {

// Chunk length of a launch: split_tokens in deterministic mode; in fast mode
// choose_chunk_tokens over the batch's work and `num_workers` resident CTAs.
int32_t launch_chunk_tokens(const DecodeLaunch& launch, const CacheGeometry& g,
                            int32_t num_workers);

// How many items and partial-state rows a launch's work list holds.
struct WorkListSize {
  int64_t items = 0;
  int64_t partial_rows = 0;  // sum over items of (rows of its sequence) * num_q_heads
};
WorkListSize size_work_list(const DecodeLaunch& launch, int32_t num_q_heads, int32_t chunk_tokens);

// The work list's arrays, each of the size its comment gives.
struct WorkListArrays {
  std::span<int32_t> item_seq;      // [items]
  std::span<int32_t> item_chunk;    // [items]
  std::span<int32_t> item_partial;  // [items] first partial row of the item
  std::span<int32_t> item_indptr;   // [batch + 1]
  std::span<int32_t> splits;        // [batch] chunks launched per sequence; may be empty
};
void fill_work_list(const DecodeLaunch& launch, int32_t num_q_heads, int32_t chunk_tokens,
                    const WorkListArrays& out);

}  // namespace pagoda::cuda
