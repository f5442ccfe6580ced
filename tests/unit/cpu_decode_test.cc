// The CPU backend against the double-precision reference over a declared table.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <tuple>

#include "unit/cache_fixture.h"

namespace pagoda::testing {
namespace {

const int32_t kLengths[] = {0, 1, 15, 16, 17, 1000, 4097};
constexpr int32_t kLayer = 1;  // layer 0 stays NaN: a wrong layer offset shows
constexpr int32_t kKvHeads = 2;
constexpr int32_t kSplitTokens = 512;

// Bounds per output dtype: the reference sees the same rounded K/V/q, so the
// error is fp32 accumulation (~1e-6 on |o| < 1 over 4,097 tokens) plus the final
// rounding of o to q's dtype: half an ulp at |o| < 1 is 2^-11 (fp16) or
// 2^-8 (bf16). NMSE bounds sit two orders below ggml's 5e-4.
struct Bounds {
  double max_abs;
  double nmse;
};
Bounds bounds_for(DType out) {
  switch (out) {
    case DType::kFloat32: return {2e-5, 1e-9};
    case DType::kFloat16: return {1e-3, 1e-6};
    case DType::kBFloat16: return {8e-3, 3e-5};
  }
  return {0, 0};
}

struct Case {
  int32_t head_dim;
  int32_t gqa;
  int32_t block_size;
  DType cache;
  DType q;
};

std::string case_name(const ::testing::TestParamInfo<Case>& info) {
  const Case& c = info.param;
  return "d" + std::to_string(c.head_dim) + "_gqa" + std::to_string(c.gqa) + "_bs" + std::to_string(c.block_size) +
         "_kv" + std::string(dtype_name(c.cache)) + "_q" + std::string(dtype_name(c.q));
}

std::vector<Case> table() {
  std::vector<Case> cases;
  for (int32_t d : {64, 128, 256})
    for (int32_t gqa : {1, 4, 8})
      for (int32_t bs : {1, 3, 7, 16})
        for (DType cache : {DType::kFloat32, DType::kFloat16, DType::kBFloat16})
          for (DType q : {DType::kFloat32, DType::kFloat16, DType::kBFloat16}) {
            // q in fp32 against every cache dtype, and q in the cache's own dtype.
            if (q == DType::kFloat32 || q == cache) cases.push_back({d, gqa, bs, cache, q});
          }
  return cases;
}

class CpuDecode : public ::testing::TestWithParam<Case> {};

TEST_P(CpuDecode, MatchesReference) {
  const Case& c = GetParam();
  CacheGeometry g;
  g.num_layers = 2;
  g.num_kv_heads = kKvHeads;
  g.num_q_heads = kKvHeads * c.gqa;
  g.head_dim = c.head_dim;
  g.block_size = c.block_size;
  g.dtype = c.cache;
  int32_t blocks = 8;  // spare blocks that stay free (and NaN)
  for (int32_t len : kLengths) blocks += (len + c.block_size) / c.block_size;
  g.num_blocks = blocks;
  CacheFixture f({g, 2, 1234});

  const int32_t batch = static_cast<int32_t>(std::size(kLengths));
  const auto q = f.random_queries(batch, c.q);
  std::vector<SequenceId> ids;
  for (int32_t b = 0; b < batch; ++b) {
    // The last token carries the row max of each group's first head.
    const int32_t len = kLengths[b];
    ids.push_back(f.add_sequence(kLayer, len > 0 ? len - 1 : 0));
    if (len > 0) f.append_spike(ids.back(), kLayer, q, b);
  }
  const float scale = 1.f / std::sqrt(static_cast<float>(c.head_dim));
  const auto got = f.decode(kLayer, ids, q, scale, SplitMode::kDeterministic, kSplitTokens);
  const auto want = f.reference(kLayer, ids, q, scale);

  const Bounds bound = bounds_for(c.q);
  const ErrorStats e = compare(want.out, got.out);
  EXPECT_FALSE(e.has_nan);
  EXPECT_LE(e.max_abs, bound.max_abs);
  EXPECT_LE(e.nmse, bound.nmse);
  for (size_t i = 0; i < want.lse.size(); ++i) {
    if (std::isinf(want.lse[i])) {
      EXPECT_EQ(got.lse[i], -INFINITY) << "row " << i;
    } else {
      EXPECT_NEAR(got.lse[i], want.lse[i], 1e-4 * std::max(1.0, std::abs(want.lse[i]))) << "row " << i;
    }
  }
  for (int32_t b = 0; b < batch; ++b) {
    EXPECT_EQ(got.splits[b], (kLengths[b] + kSplitTokens - 1) / kSplitTokens) << "sequence " << b;
    if (kLengths[b] == 0) {
      for (int32_t i = 0; i < g.num_q_heads * g.head_dim; ++i) ASSERT_EQ(got.out[b * g.num_q_heads * g.head_dim + i], 0.f);
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Table, CpuDecode, ::testing::ValuesIn(table()), case_name);

TEST(CpuDecodeFastMode, MatchesReference) {
  CacheGeometry g;
  g.num_layers = 1;
  g.num_kv_heads = 2;
  g.num_q_heads = 8;
  g.head_dim = 128;
  g.block_size = 16;
  g.dtype = DType::kFloat16;
  g.num_blocks = 600;
  CacheFixture f({g, 2, 99});
  const std::vector<SequenceId> ids = {f.add_sequence(0, 3000), f.add_sequence(0, 5), f.add_sequence(0, 1200)};
  const auto q = f.random_queries(3, DType::kFloat32);
  const auto got = f.decode(0, ids, q, 0.0883883f, SplitMode::kFast, 512);
  const auto want = f.reference(0, ids, q, 0.0883883);
  const ErrorStats e = compare(want.out, got.out);
  EXPECT_FALSE(e.has_nan);
  EXPECT_LE(e.max_abs, 2e-5);
  EXPECT_EQ(got.chunk_tokens % 16, 0);
  EXPECT_EQ(got.splits[0], (3000 + got.chunk_tokens - 1) / got.chunk_tokens);
}

TEST(CpuBackend, RejectsUnsupportedGeometry) {
  BackendOptions o;
  o.kind = "cpu";
  o.geometry.num_blocks = 4;
  o.geometry.head_dim = 96;
  auto b = make_backend(o);
  ASSERT_FALSE(b.ok());
  EXPECT_EQ(b.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(b.status().message().find("head_dim"), std::string::npos);
  EXPECT_NE(b.status().message().find("96"), std::string::npos);
  o.geometry.head_dim = 64;
  o.geometry.num_q_heads = 3;
  o.geometry.num_kv_heads = 2;
  EXPECT_EQ(make_backend(o).status().code(), StatusCode::kInvalidArgument);
}

TEST(BackendFactory, CudaWithoutCudaSaysSo) {
  if (cuda_built()) GTEST_SKIP() << "this build has the CUDA backend";
  BackendOptions o;
  o.kind = "cuda";
  o.geometry.num_blocks = 4;
  auto b = make_backend(o);
  ASSERT_FALSE(b.ok());
  EXPECT_NE(b.status().message().find("built without CUDA"), std::string::npos) << b.status().message();
}

}  // namespace
}  // namespace pagoda::testing
