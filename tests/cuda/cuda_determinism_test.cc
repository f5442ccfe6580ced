// Deterministic mode on the GPU: a sequence's output bits do not depend on the
// batch it shares (alone vs in a batch of 37, in the middle of it).
#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "cuda/skip_without_device.h"
#include "unit/cache_fixture.h"

namespace pagoda::testing {
namespace {

constexpr int32_t kBatch = 37;
constexpr int32_t kPosition = 18;  // where the sequence sits inside the batch

CacheGeometry geometry(DType cache) {
  CacheGeometry g;
  g.num_layers = 1;
  g.num_kv_heads = 2;
  g.num_q_heads = 8;
  g.head_dim = 128;
  g.block_size = 16;
  g.dtype = cache;
  g.num_blocks = 2048;
  return g;
}

class CudaDeterminism : public ::testing::TestWithParam<DType> {};

TEST_P(CudaDeterminism, AloneAndInABatchOf37GiveTheSameBits) {
  PAGODA_SKIP_WITHOUT_CUDA_DEVICE();
  const CacheGeometry g = geometry(GetParam());
  FixtureOptions options(g, 1, 2024);
  options.backend = "cuda";
  CacheFixture f(options);
  std::vector<int32_t> lengths;
  for (int32_t i = 0; i < kBatch; ++i) lengths.push_back(i == kPosition ? 2500 : 1 + (i * 397) % 1500);
  const std::vector<SequenceId> batch = f.add_sequences(0, lengths);
  const int32_t row = g.num_q_heads * g.head_dim;
  for (DType q_dtype : {DType::kFloat32, GetParam()}) {
    SCOPED_TRACE(std::string("q ") + std::string(dtype_name(q_dtype)));
    const CacheFixture::Queries q_batch = f.random_queries(kBatch, q_dtype);
    const CacheFixture::Queries q_alone = select_rows(q_batch, {kPosition}, row);
    const CacheFixture::Decoded alone = f.decode(0, {batch[kPosition]}, q_alone, 0.088f, SplitMode::kDeterministic, 512);
    const CacheFixture::Decoded mixed = f.decode(0, batch, q_batch, 0.088f, SplitMode::kDeterministic, 512);
    const size_t bytes = static_cast<size_t>(row) * dtype_size(q_dtype);
    ASSERT_EQ(alone.out_bytes.size(), bytes);
    EXPECT_EQ(0, std::memcmp(alone.out_bytes.data(), mixed.out_bytes.data() + kPosition * bytes,
                             bytes))
        << "the batch changed the output bits";
    EXPECT_EQ(0, std::memcmp(alone.lse.data(), mixed.lse.data() + kPosition * g.num_q_heads,
                             g.num_q_heads * sizeof(float)))
        << "the batch changed the LSE bits";
    EXPECT_EQ(alone.splits[0], 5);  // 2,500 tokens in chunks of 512
    EXPECT_EQ(mixed.splits[kPosition], 5);

    // And the same launch twice gives the same bits.
    const CacheFixture::Decoded again = f.decode(0, batch, q_batch, 0.088f, SplitMode::kDeterministic, 512);
    EXPECT_EQ(mixed.out_bytes, again.out_bytes);
  }
}

INSTANTIATE_TEST_SUITE_P(CacheDtypes, CudaDeterminism,
                         ::testing::Values(DType::kFloat32, DType::kFloat16, DType::kBFloat16),
                         [](const ::testing::TestParamInfo<DType>& info) {
                           return std::string(dtype_name(info.param));
                         });

}  // namespace
}  // namespace pagoda::testing
