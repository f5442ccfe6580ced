#pragma once
// The flat work list of a decode launch, built on the host: one item per
// (sequence, chunk), sequence-major and in chunk order, so short sequences launch
// no empty chunks and the merge finds a sequence's partials contiguous.

#include <cstdint>

#include "pagoda/backend.h"

namespace pagoda::cuda {

// Chunk length of a launch: split_tokens in deterministic mode; in fast mode
// choose_chunk_tokens over the batch's work and `num_workers` resident CTAs.
int32_t launch_chunk_tokens(const DecodeLaunch& launch, const CacheGeometry& g,
                            int32_t num_workers);

// Sum over the batch of num_chunks(lengths[b], chunk_tokens).
int64_t count_work_items(const int32_t* lengths, int32_t batch, int32_t chunk_tokens);

// item_seq, item_chunk: [count_work_items(...)]; item_indptr: [batch + 1].
void fill_work_list(const int32_t* lengths, int32_t batch, int32_t chunk_tokens,
                    int32_t* item_seq, int32_t* item_chunk, int32_t* item_indptr);

}  // namespace pagoda::cuda
