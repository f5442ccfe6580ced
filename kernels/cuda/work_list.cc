#include "cuda/work_list.h"

#include <cassert>

#include "pagoda/key_ranges.h"
#include "pagoda/split_plan.h"

namespace pagoda::cuda {

int32_t launch_chunk_tokens(const DecodeLaunch& launch, const CacheGeometry& g,
                            int32_t num_workers) {
  SplitPlanInput in;
  in.mode = launch.mode;
  in.split_tokens = launch.split_tokens;
  in.block_size = g.block_size;
  in.num_kv_heads = g.num_kv_heads;
  in.num_workers = num_workers;
  for (int32_t b = 0; b < launch.tables.batch; ++b) {
    const int32_t len = launch.tables.lengths[b];
    in.total_tokens += len;
    if (len > in.max_length) in.max_length = len;
  }
  return choose_chunk_tokens(in);
}

namespace {

ChunkSpan sequence_chunks(const DecodeLaunch& launch, int32_t b, int32_t chunk_tokens) {
  return chunks_needed(launch.tables.lengths[b], launch.rows_of(b), launch.sliding_window, chunk_tokens);
}

}  // namespace

WorkListSize size_work_list(const DecodeLaunch& launch, int32_t num_q_heads, int32_t chunk_tokens) {
  WorkListSize size;
  for (int32_t b = 0; b < launch.tables.batch; ++b) {
    const int64_t chunks = sequence_chunks(launch, b, chunk_tokens).count();
    size.items += chunks;
    size.partial_rows += chunks * launch.rows_of(b) * num_q_heads;
  }
  return size;
}

void fill_work_list(const DecodeLaunch& launch, int32_t num_q_heads, int32_t chunk_tokens,
                    const WorkListArrays& out) {
  const int32_t batch = launch.tables.batch;
  assert(out.item_indptr.size() == static_cast<size_t>(batch) + 1);
  int32_t item = 0;
  int32_t partial = 0;  // the caller checked that every row fits an int32
  for (int32_t b = 0; b < batch; ++b) {
    out.item_indptr[b] = item;
    const ChunkSpan chunks = sequence_chunks(launch, b, chunk_tokens);
    if (!out.splits.empty()) out.splits[b] = chunks.count();
    for (int32_t c = chunks.first; c < chunks.end; ++c, ++item) {
      out.item_seq[item] = b;
      out.item_chunk[item] = c;
      out.item_partial[item] = partial;
      partial += launch.rows_of(b) * num_q_heads;
    }
  }
  out.item_indptr[batch] = item;
}

}  // namespace pagoda::cuda
