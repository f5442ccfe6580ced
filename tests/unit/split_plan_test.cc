#include <gtest/gtest.h>

#include "pagoda/split_plan.h"

namespace pagoda {
namespace {

TEST(SplitPlan, ChunksCoverTheSequenceExactly) {
  for (int64_t len : {0, 1, 511, 512, 513, 4097}) {
    const int32_t n = num_chunks(len, 512);
    EXPECT_EQ(n, (len + 511) / 512) << len;
    int64_t covered = 0;
    for (int32_t c = 0; c < n; ++c) {
      const ChunkRange r = chunk_range(len, 512, c);
      EXPECT_EQ(r.begin, covered) << len;
      EXPECT_GT(r.end, r.begin) << len;
      covered = r.end;
    }
    EXPECT_EQ(covered, len);
  }
}

TEST(SplitPlan, DeterministicChunkIgnoresBatchAndWorkers) {
  SplitPlanInput in;
  in.split_tokens = 256;
  for (int32_t workers : {1, 2, 132})
    for (int64_t total : {int64_t{1}, int64_t{1} << 20}) {
      in.num_workers = workers;
      in.total_tokens = total;
      in.max_length = 8192;
      EXPECT_EQ(choose_chunk_tokens(in), 256);
    }
}

TEST(SplitPlan, FastChunkAdaptsToWorkersAndStaysBlockAligned) {
  SplitPlanInput in;
  in.mode = SplitMode::kFast;
  in.split_tokens = 512;
  in.block_size = 16;
  in.num_kv_heads = 8;
  in.total_tokens = 8192;  // one long sequence
  in.max_length = 8192;
  in.num_workers = 2;
  const int32_t few = choose_chunk_tokens(in);
  in.num_workers = 132;
  const int32_t many = choose_chunk_tokens(in);
  EXPECT_LT(many, few);  // more workers -> more, shorter chunks
  for (int32_t c : {few, many}) {
    EXPECT_EQ(c % 16, 0);
    EXPECT_GE(c, kMinFastChunkTokens);
    EXPECT_LE(c, 8192);
  }
  in.block_size = 7;
  EXPECT_EQ(choose_chunk_tokens(in) % 7, 0);
}

}  // namespace
}  // namespace pagoda
