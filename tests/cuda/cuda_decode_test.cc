// The CUDA backend against the double-precision reference and against the CPU
// backend, over the same declared shape table as the CPU tests.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "cuda/kv_fixture.h"
#include "reference/decode_table.h"

namespace pagoda::testing {
namespace {

using Case = DecodeCase;
constexpr auto& kLengths = kTableLengths;
constexpr int32_t kLayer = kTableLayer;
constexpr int32_t kSplitTokens = kTableSplitTokens;

CacheGeometry geometry_for(const Case& c) {
  CacheGeometry g;
  g.num_layers = 2;
  g.num_kv_heads = c.kv_heads;
  g.num_q_heads = c.kv_heads * c.gqa;
  g.head_dim = c.head_dim;
  g.v_head_dim = c.v_head_dim;
  g.block_size = c.block_size;
  g.dtype = c.cache;
  int32_t blocks = 8;  // spare blocks that stay free (and NaN)
  for (int32_t len : kLengths) blocks += len / c.block_size + 1;
  g.num_blocks = blocks;
  return g;
}

void expect_matches_reference(const CacheGeometry& g, const Decoded& got, const ReferenceResult& want,
                              DType q_dtype, const char* what) {
  SCOPED_TRACE(what);
  expect_table_decode(g, got, want, q_dtype);
}

class CudaDecode : public ::testing::TestWithParam<Case> {};

TEST_P(CudaDecode, MatchesReferenceAndCpuBackend) {
  PAGODA_SKIP_WITHOUT_CUDA_DEVICE();
  const Case& c = GetParam();
  const CacheGeometry g = geometry_for(c);
  KvFixture f(g, {"cuda", "cpu"}, 1234);
  ASSERT_TRUE(f.ok()) << f.status().message();

  const int32_t batch = static_cast<int32_t>(std::size(kLengths));
  const Queries q = f.random_queries(batch, c.q);
  std::vector<int32_t> seqs;
  for (int32_t b = 0; b < batch; ++b) seqs.push_back(f.add_sequence(kLayer, kLengths[b], &q, b));
  const float scale = 1.f / std::sqrt(static_cast<float>(c.head_dim));
  const ReferenceResult want = f.reference(kLayer, seqs, q, scale);

  const Decoded det = f.decode(0, kLayer, seqs, q, scale, SplitMode::kDeterministic, kSplitTokens);
  EXPECT_EQ(det.chunk_tokens, kSplitTokens);
  expect_matches_reference(g, det, want, c.q, "deterministic");

  const Decoded fast = f.decode(0, kLayer, seqs, q, scale, SplitMode::kFast, kSplitTokens);
  EXPECT_EQ(fast.chunk_tokens % c.block_size, 0);
  expect_matches_reference(g, fast, want, c.q, "fast");

  // The CPU backend on the same cache: both sit within the dtype's bounds.
  const Decoded cpu = f.decode(1, kLayer, seqs, q, scale, SplitMode::kDeterministic, kSplitTokens);
  std::vector<double> cpu_out(cpu.out.begin(), cpu.out.end());
  const ErrorStats e = compare(cpu_out, det.out);
  EXPECT_LE(e.max_abs, between_backends(c.q).max_abs) << "CUDA vs CPU";
  EXPECT_LE(e.nmse, between_backends(c.q).nmse) << "CUDA vs CPU";
  EXPECT_EQ(cpu.splits, det.splits);
}

INSTANTIATE_TEST_SUITE_P(Table, CudaDecode, ::testing::ValuesIn(decode_table()), case_name);

// Group sizes outside the table: 3 and 6 leave head slots of a thread unused;
// 22 query heads on one KV head at head_dim 256 take two passes over the chunk,
// the second with a partly filled head block.
class CudaDecodeOddGroups : public ::testing::TestWithParam<Case> {};

TEST_P(CudaDecodeOddGroups, MatchesReference) {
  PAGODA_SKIP_WITHOUT_CUDA_DEVICE();
  const Case& c = GetParam();
  CacheGeometry g = geometry_for(c);
  g.num_kv_heads = 1;
  g.num_q_heads = c.gqa;
  KvFixture f(g, {"cuda"}, 4321);
  ASSERT_TRUE(f.ok()) << f.status().message();
  const int32_t batch = static_cast<int32_t>(std::size(kLengths));
  const Queries q = f.random_queries(batch, c.q);
  std::vector<int32_t> seqs;
  for (int32_t b = 0; b < batch; ++b) seqs.push_back(f.add_sequence(kLayer, kLengths[b], &q, b));
  const float scale = 1.f / std::sqrt(static_cast<float>(c.head_dim));
  const ReferenceResult want = f.reference(kLayer, seqs, q, scale);
  const Decoded got = f.decode(0, kLayer, seqs, q, scale, SplitMode::kDeterministic, kSplitTokens);
  expect_matches_reference(g, got, want, c.q, "deterministic");
}

INSTANTIATE_TEST_SUITE_P(Groups, CudaDecodeOddGroups,
                         ::testing::Values(Case{128, 3, 16, DType::kBFloat16, DType::kFloat32},
                                           Case{64, 6, 7, DType::kFloat16, DType::kFloat16},
                                           Case{256, 22, 5, DType::kFloat32, DType::kFloat32}),
                         case_name);

// One key: softmax weight exactly 1, so the output is that key's value row to
// the bit (the one-chunk path through the merge adds no rounding) and the LSE
// is the score.
TEST(CudaDecodeOneKey, OutputIsTheValueRowExactly) {
  PAGODA_SKIP_WITHOUT_CUDA_DEVICE();
  const CacheGeometry g = geometry_for({128, 4, 16, DType::kFloat16, DType::kFloat32});
  KvFixture f(g, {"cuda"}, 77);
  ASSERT_TRUE(f.ok()) << f.status().message();
  const Queries q = f.random_queries(3, DType::kFloat32);
  const std::vector<int32_t> seqs = {f.add_sequence(kLayer, 1), f.add_sequence(kLayer, 1),
                                     f.add_sequence(kLayer, 1)};
  const Decoded d = f.decode(0, kLayer, seqs, q, 0.088f, SplitMode::kDeterministic, 512);
  for (int32_t b = 0; b < 3; ++b) {
    for (int32_t h = 0; h < g.num_q_heads; ++h) {
      const std::vector<double> v = f.value_row(kLayer, seqs[b], 0, h / g.group_size());
      for (int32_t i = 0; i < g.head_dim; ++i) {
        ASSERT_EQ(d.out[(b * g.num_q_heads + h) * g.head_dim + i], static_cast<float>(v[i]))
            << "sequence " << b << " head " << h << " element " << i;
      }
    }
  }
}

}  // namespace
}  // namespace pagoda::testing
