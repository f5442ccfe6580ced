// Deterministic mode: a sequence's output bytes do not depend on its batch or on
// the number of threads.
#include <gtest/gtest.h>

#include <cstring>
#include <string>

#include "unit/cache_fixture.h"

namespace pagoda::testing {
namespace {

CacheGeometry geometry(DType cache = DType::kBFloat16) {
  CacheGeometry g;
  g.num_layers = 1;
  g.num_kv_heads = 2;
  g.num_q_heads = 8;
  g.head_dim = 64;
  g.block_size = 16;
  g.dtype = cache;
  g.num_blocks = 2048;
  return g;
}

// The same seeded cache: sequence 0 of length 2,500 and 37 others of varied lengths.
struct Decodes {
  std::vector<uint8_t> alone_out, batch_out;
  std::vector<float> alone_lse, batch_lse;
};

Decodes run(int32_t threads, SplitMode mode, DType cache) {
  FixtureOptions o{geometry(cache), threads, 2024};
  if (is_fp8(cache)) o.kv_scales = {KvScale{0.5f, 0.25f}};
  CacheFixture f(o);
  std::vector<SequenceId> ids = {f.add_sequence(0, 2500)};
  for (int32_t i = 0; i < 37; ++i) ids.push_back(f.add_sequence(0, 1 + (i * 397) % 1500));
  const auto q_batch = f.random_queries(38, DType::kFloat32);
  CacheFixture::Queries q_alone = q_batch;
  const size_t row = static_cast<size_t>(8) * 64;
  q_alone.values.resize(row);
  q_alone.bytes.resize(row * 4);
  // Put sequence 0 in the middle of the batch.
  std::vector<SequenceId> mixed = ids;
  std::swap(mixed[0], mixed[19]);
  CacheFixture::Queries q_mixed = q_batch;
  std::swap_ranges(q_mixed.bytes.begin(), q_mixed.bytes.begin() + row * 4, q_mixed.bytes.begin() + 19 * row * 4);
  const auto alone = f.decode(0, {ids[0]}, q_alone, 0.125f, mode, 512);
  const auto batch = f.decode(0, mixed, q_mixed, 0.125f, mode, 512);
  Decodes d;
  d.alone_out = alone.out_bytes;
  d.alone_lse = alone.lse;
  d.batch_out.assign(batch.out_bytes.begin() + 19 * row * 4, batch.out_bytes.begin() + 20 * row * 4);
  d.batch_lse.assign(batch.lse.begin() + 19 * 8, batch.lse.begin() + 20 * 8);
  return d;
}

class Determinism : public ::testing::TestWithParam<DType> {};

// bf16, and both fp8 caches with K/V scales.
TEST_P(Determinism, AloneInABatchOf37AndAcrossThreadCountsIsBitIdentical) {
  const Decodes one = run(1, SplitMode::kDeterministic, GetParam());
  const Decodes two = run(2, SplitMode::kDeterministic, GetParam());
  ASSERT_EQ(one.alone_out.size(), one.batch_out.size());
  EXPECT_EQ(one.alone_out, one.batch_out) << "batch composition changed the bits";
  EXPECT_EQ(one.alone_out, two.alone_out) << "thread count changed the bits";
  EXPECT_EQ(two.alone_out, two.batch_out);
  EXPECT_EQ(std::memcmp(one.alone_lse.data(), one.batch_lse.data(), 8 * sizeof(float)), 0);
  EXPECT_EQ(std::memcmp(one.alone_lse.data(), two.batch_lse.data(), 8 * sizeof(float)), 0);
}

INSTANTIATE_TEST_SUITE_P(CacheDtypes, Determinism,
                         ::testing::Values(DType::kBFloat16, DType::kFloat8E4M3, DType::kFloat8E5M2),
                         [](const ::testing::TestParamInfo<DType>& info) { return std::string(dtype_name(info.param)); });

TEST(DeterminismModes, FastModeSplitsByBatchSoTheCheckCanTellTheModesApart) {
  // In fast mode the chunk length follows the batch: alone, a 2,500-token
  // sequence is cut finer than inside 38 sequences. This is the freedom the
  // deterministic mode gives up; it shows as different chunk counts.
  CacheFixture f({geometry(), 2, 7});
  std::vector<SequenceId> ids = {f.add_sequence(0, 2500)};
  for (int32_t i = 0; i < 37; ++i) ids.push_back(f.add_sequence(0, 700));
  const auto q = f.random_queries(38, DType::kFloat32);
  auto q1 = q;
  q1.values.resize(8 * 64);
  q1.bytes.resize(8 * 64 * 4);
  const auto alone = f.decode(0, {ids[0]}, q1, 0.125f, SplitMode::kFast, 512);
  const auto batch = f.decode(0, ids, q, 0.125f, SplitMode::kFast, 512);
  EXPECT_GT(alone.splits[0], batch.splits[0]);
}

}  // namespace
}  // namespace pagoda::testing
