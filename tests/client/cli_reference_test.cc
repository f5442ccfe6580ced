// pagoda-cli demo's own reference agrees with the tests' oracle (two independent
// double-precision implementations), including GQA, an empty sequence and the
// comparison's NaN / -inf handling.
#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include <gtest/gtest.h>

#include "reference.h"
#include "reference/naive_attention.h"

namespace pagoda::client {
namespace {

TEST(CliReference, MatchesTheTestOracleWithGqa) {
  const CacheGeometry g{.num_layers = 1, .num_q_heads = 8, .num_kv_heads = 2, .head_dim = 64,
                        .block_size = 16, .num_blocks = 4, .dtype = DType::kFloat32};
  std::mt19937_64 rng(9);
  std::normal_distribution<float> normal(0.f, 1.f);
  const int32_t n = 53;
  // The sequence's K/V as [n, kv_heads, head_dim] for the CLI reference and in
  // the paged layout (blocks 0..3) for the oracle.
  std::vector<float> k(static_cast<size_t>(n) * 2 * 64), v(k.size()), q(8 * 64);
  for (float& x : k) x = normal(rng);
  for (float& x : v) x = normal(rng);
  for (float& x : q) x = normal(rng);
  std::vector<double> kp(g.pool_elements()), vp(g.pool_elements());
  for (int32_t t = 0; t < n; ++t)
    for (int32_t h = 0; h < 2; ++h)
      for (int32_t i = 0; i < 64; ++i) {
        const int64_t off = g.element_offset(0, t / 16, h, t % 16) + i;
        kp[off] = k[(static_cast<size_t>(t) * 2 + h) * 64 + i];
        vp[off] = v[(static_cast<size_t>(t) * 2 + h) * 64 + i];
      }
  const int32_t indptr[2] = {0, 4}, ids[4] = {0, 1, 2, 3};
  const BatchBlockTables tables{1, indptr, ids, &n};
  const auto oracle = testing::naive_decode(g, kp, vp, 0, tables, std::vector<double>(q.begin(), q.end()), 0.125);
  const auto mine = reference_decode({8, 2, 64}, q, k, v, 0.0);  // 0 -> 1/sqrt(64) = 0.125
  ASSERT_EQ(mine.out.size(), oracle.out.size());
  for (size_t i = 0; i < mine.out.size(); ++i) EXPECT_NEAR(mine.out[i], oracle.out[i], 1e-12);
  for (size_t h = 0; h < mine.lse.size(); ++h) EXPECT_NEAR(mine.lse[h], oracle.lse[h], 1e-12);
}

TEST(CliReference, EmptySequenceIsZeroWithMinusInfinityLse) {
  const std::vector<float> q(4 * 64, 1.f);
  const auto r = reference_decode({4, 4, 64}, q, {}, {}, 0.0);
  for (double x : r.out) EXPECT_EQ(x, 0.0);
  for (double l : r.lse) EXPECT_EQ(l, -std::numeric_limits<double>::infinity());
}

TEST(CliReference, ComparisonFailsOnNanInfAndTolerance) {
  const double inf = std::numeric_limits<double>::infinity();
  const std::vector<double> want = {1.0, -inf, 2.0};
  EXPECT_TRUE(compare(want, std::vector<float>{1.f, -INFINITY, 2.00005f}, 1e-4, 0).pass);
  EXPECT_FALSE(compare(want, std::vector<float>{1.f, -INFINITY, 2.001f}, 1e-4, 0).pass);
  EXPECT_FALSE(compare(want, std::vector<float>{NAN, -INFINITY, 2.f}, 1e-4, 0).pass);
  EXPECT_FALSE(compare(want, std::vector<float>{1.f, 0.f, 2.f}, 1e-4, 0).pass);  // -inf expected
  EXPECT_FALSE(compare(want, std::vector<float>{1.f, -INFINITY}, 1e-4, 0).pass);  // size
  const Comparison c = compare(want, std::vector<float>{1.f, -INFINITY, 2.001f}, 1e-4, 1e-3);
  EXPECT_TRUE(c.pass);  // within atol + rtol * |want|
  EXPECT_NEAR(c.max_abs_error, 1e-3, 1e-6);
}

}  // namespace
}  // namespace pagoda::client
