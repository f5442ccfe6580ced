#include "cuda/work_list.h"

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

int64_t count_work_items(const int32_t* lengths, int32_t batch, int32_t chunk_tokens) {
  int64_t items = 0;
  for (int32_t b = 0; b < batch; ++b) items += num_chunks(lengths[b], chunk_tokens);
  return items;
}

void fill_work_list(const int32_t* lengths, int32_t batch, int32_t chunk_tokens,
                    int32_t* item_seq, int32_t* item_chunk, int32_t* item_indptr) {
  int32_t item = 0;
  for (int32_t b = 0; b < batch; ++b) {
    item_indptr[b] = item;
    const int32_t chunks = num_chunks(lengths[b], chunk_tokens);
    for (int32_t c = 0; c < chunks; ++c, ++item) {
      item_seq[item] = b;
      item_chunk[item] = c;
    }
  }
  item_indptr[batch] = item;
}

}  // namespace pagoda::cuda
