#pragma once
// The split plan: how a sequence's keys are cut into chunks, each of which yields
// one partial state per query head.
//
// Deterministic mode: every chunk is `split_tokens` long (the last one shorter),
// so chunk boundaries depend on the sequence length alone and never on the batch,
// the number of threads or the number of SMs. Fast mode picks a chunk length per
// launch from the amount of work and the number of workers (few long sequences ->
// more, shorter chunks), so results may differ in the last bits between batches.

#include <cstdint>

#include "pagoda/hd.h"

namespace pagoda {

enum class SplitMode : uint8_t { kDeterministic, kFast };

// Number of chunks of a sequence of `length` tokens cut every `chunk_tokens`;
// a sequence of length 0 has no chunk at all.
HD int32_t num_chunks(int64_t length, int32_t chunk_tokens) {
  return static_cast<int32_t>((length + chunk_tokens - 1) / chunk_tokens);
}

// Tokens [begin, end) of chunk `c`. Lengths are signed 64-bit so that
// `length - begin` can never wrap around.
struct ChunkRange {
  int64_t begin;
  int64_t end;
};

HD ChunkRange chunk_range(int64_t length, int32_t chunk_tokens, int32_t c) {
  const int64_t begin = static_cast<int64_t>(c) * chunk_tokens;
  const int64_t end = begin + chunk_tokens < length ? begin + chunk_tokens : length;
  return {begin, end};
}

struct SplitPlanInput {
  SplitMode mode = SplitMode::kDeterministic;
  int32_t split_tokens = 512;  // server constant; a multiple of block_size
  int32_t block_size = 16;
  int64_t total_tokens = 0;    // sum of the batch's sequence lengths
  int32_t max_length = 0;      // longest sequence of the batch
  int32_t num_kv_heads = 1;
  int32_t num_workers = 1;     // CPU threads, or concurrent CTAs on the GPU
};

// Chunk length for one launch. Deterministic: split_tokens. Fast: aims for about
// `kWavesPerWorker` work items (sequence, KV head, chunk) per worker so that the
// last wave is well filled, with chunks no shorter than one block (or 64 tokens)
// and no longer than the longest sequence needs.
inline constexpr int32_t kWavesPerWorker = 4;
inline constexpr int32_t kMinFastChunkTokens = 64;

HD int32_t round_up(int64_t x, int32_t multiple) {
  return static_cast<int32_t>((x + multiple - 1) / multiple * multiple);
}

HD int32_t choose_chunk_tokens(const SplitPlanInput& in) {
  if (in.mode == SplitMode::kDeterministic) return in.split_tokens;
  const int64_t target_items = static_cast<int64_t>(in.num_workers) * kWavesPerWorker;
  const int64_t work = in.total_tokens * in.num_kv_heads;
  int64_t chunk = target_items > 0 ? (work + target_items - 1) / target_items : work;
  const int64_t floor_tokens = in.block_size > kMinFastChunkTokens ? in.block_size : kMinFastChunkTokens;
  if (chunk < floor_tokens) chunk = floor_tokens;
  if (chunk > in.max_length) chunk = in.max_length;
  if (chunk < 1) chunk = 1;
  return round_up(chunk, in.block_size);
}

}  // namespace pagoda
