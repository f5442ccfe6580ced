// The CUDA backend against the double-precision reference and against the CPU
// backend, over the same declared shape table as the CPU tests.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "cuda/skip_without_device.h"
#include "unit/cache_fixture.h"
#include "reference/decode_table.h"

namespace pagoda::testing {
namespace {

using Case = DecodeCase;
using Queries = CacheFixture::Queries;
using Decoded = CacheFixture::Decoded;
constexpr auto& kLengths = kTableLengths;
constexpr int32_t kLayer = kTableLayer;
constexpr int32_t kSplitTokens = kTableSplitTokens;


FixtureOptions cuda_options(const CacheGeometry& g, uint64_t seed, std::vector<std::string> also = {}) {
  FixtureOptions o(g, 2, seed);
  o.backend = "cuda";
  o.also = std::move(also);
  return o;
}

std::vector<int32_t> table_lengths() { return std::vector<int32_t>(std::begin(kLengths), std::end(kLengths)); }

void expect_matches_reference(const CacheGeometry& g, const Decoded& got, const ReferenceResult& want,
                              DType q_dtype, const char* what) {
  SCOPED_TRACE(what);
  expect_table_decode(g, got, want, q_dtype);
}

class CudaDecode : public ::testing::TestWithParam<Case> {};

TEST_P(CudaDecode, MatchesReferenceAndCpuBackend) {
  PAGODA_SKIP_WITHOUT_CUDA_DEVICE();
  const Case& c = GetParam();
  const CacheGeometry g = table_geometry(c);
  CacheFixture f(cuda_options(g, 1234, {"cpu"}));

  const int32_t batch = static_cast<int32_t>(std::size(kLengths));
  const Queries q = f.random_queries(batch, c.q);
  const std::vector<SequenceId> seqs = f.add_sequences(kLayer, table_lengths(), &q);
  const float scale = 1.f / std::sqrt(static_cast<float>(c.head_dim));
  const ReferenceResult want = f.reference(kLayer, seqs, q, scale);

  const Decoded det = f.decode_on(0, kLayer, seqs, q, scale, SplitMode::kDeterministic, kSplitTokens);
  EXPECT_EQ(det.chunk_tokens, kSplitTokens);
  expect_matches_reference(g, det, want, c.q, "deterministic");

  const Decoded fast = f.decode_on(0, kLayer, seqs, q, scale, SplitMode::kFast, kSplitTokens);
  EXPECT_EQ(fast.chunk_tokens % c.block_size, 0);
  expect_matches_reference(g, fast, want, c.q, "fast");

  // The CPU backend on the same cache: both sit within the dtype's bounds.
  const Decoded cpu = f.decode_on(1, kLayer, seqs, q, scale, SplitMode::kDeterministic, kSplitTokens);
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
  CacheGeometry g = table_geometry(c);
  g.num_kv_heads = 1;
  g.num_q_heads = c.gqa;
  CacheFixture f(cuda_options(g, 4321));
  const int32_t batch = static_cast<int32_t>(std::size(kLengths));
  const Queries q = f.random_queries(batch, c.q);
  const std::vector<SequenceId> seqs = f.add_sequences(kLayer, table_lengths(), &q);
  const float scale = 1.f / std::sqrt(static_cast<float>(c.head_dim));
  const ReferenceResult want = f.reference(kLayer, seqs, q, scale);
  const Decoded got = f.decode(kLayer, seqs, q, scale, SplitMode::kDeterministic, kSplitTokens);
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
  const CacheGeometry g = table_geometry({128, 4, 16, DType::kFloat16, DType::kFloat32});
  CacheFixture f(cuda_options(g, 77));
  const Queries q = f.random_queries(3, DType::kFloat32);
  const std::vector<SequenceId> seqs = f.add_sequences(kLayer, {1, 1, 1});
  const Decoded d = f.decode(kLayer, seqs, q, 0.088f, SplitMode::kDeterministic, 512);
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
