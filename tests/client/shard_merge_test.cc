// Merging shards' (output, LSE) by LSE equals attending over all their keys at
// once, as computed by the double-precision reference.
#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include <gtest/gtest.h>

#include "pagoda/client/shard_merge.h"
#include "reference/naive_attention.h"

namespace pagoda::client {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

// One sequence of `length` tokens in blocks 0, 1, 2, ... of a one-layer cache,
// q for one decode step, and the reference over any token range [begin, end)
// that starts on a block boundary.
class ShardMergeTest : public ::testing::Test {
 protected:
  void SetUp() override {
    g_ = CacheGeometry{.num_layers = 1, .num_q_heads = 4, .num_kv_heads = 2, .head_dim = 64,
                       .block_size = 16, .num_blocks = 8, .dtype = DType::kFloat32};
    std::mt19937_64 rng(5);
    std::normal_distribution<double> normal(0, 1);
    k_.resize(g_.pool_elements());
    v_.resize(g_.pool_elements());
    for (double& x : k_) x = normal(rng);
    for (double& x : v_) x = normal(rng);
    q_.resize(static_cast<size_t>(g_.num_q_heads) * g_.head_dim);
    for (double& x : q_) x = normal(rng);
    // The row max of every head sits in the LAST shard: its token 97 aligns with q.
    for (int32_t kvh = 0; kvh < g_.num_kv_heads; ++kvh) {
      const int64_t off = g_.element_offset(0, 97 / 16, kvh, 97 % 16);
      for (int32_t i = 0; i < g_.head_dim; ++i)
        k_[off + i] = 0.5 * q_[static_cast<size_t>(kvh * g_.group_size()) * g_.head_dim + i];
    }
  }

  // Reference over tokens [begin, end); begin is a multiple of block_size.
  testing::ReferenceResult reference(int32_t begin, int32_t end) const {
    std::vector<int32_t> ids;
    for (int32_t b = begin / g_.block_size; b * g_.block_size < end; ++b) ids.push_back(b);
    const int32_t indptr[2] = {0, static_cast<int32_t>(ids.size())};
    const int32_t length = end - begin;
    const BatchBlockTables tables{1, indptr, ids.data(), &length};
    return testing::naive_decode(g_, k_, v_, 0, tables, q_, scale_);
  }

  // A shard as the wire delivers it: fp32 output and LSE.
  struct WireShard {
    std::vector<float> out, lse;
    ShardResult view() const { return {out, lse}; }
  };
  static WireShard to_wire(const testing::ReferenceResult& r) {
    return {{r.out.begin(), r.out.end()}, {r.lse.begin(), r.lse.end()}};
  }

  static double max_abs_diff(const std::vector<double>& want, const std::vector<float>& got) {
    double m = 0;
    for (size_t i = 0; i < want.size(); ++i) m = std::max(m, std::abs(want[i] - got[i]));
    return m;
  }

  CacheGeometry g_;
  std::vector<double> k_, v_, q_;
  double scale_ = 0.125;
};

TEST_F(ShardMergeTest, TwoHalvesEqualTheWhole) {
  const auto whole = reference(0, 100);
  const WireShard a = to_wire(reference(0, 48)), b = to_wire(reference(48, 100));
  const ShardResult shards[] = {a.view(), b.view()};
  auto merged = merge_shards(shards, g_.head_dim);
  ASSERT_TRUE(merged.ok()) << merged.error().to_string();
  // fp32 inputs and fp32 merge arithmetic: a few ulps of values of order 1.
  EXPECT_LT(max_abs_diff(whole.out, merged->output), 2e-6);
  EXPECT_LT(max_abs_diff(whole.lse, merged->lse), 2e-6);
  // The merge really changed something: neither half alone is the whole.
  EXPECT_GT(max_abs_diff(whole.out, a.out), 1e-2);
  EXPECT_GT(max_abs_diff(whole.out, b.out), 1e-2);
}

TEST_F(ShardMergeTest, ThreeUnevenShardsInAnyOrder) {
  const auto whole = reference(0, 100);
  const WireShard a = to_wire(reference(0, 32)), b = to_wire(reference(32, 48)),
                  c = to_wire(reference(48, 100));
  const ShardResult forward[] = {a.view(), b.view(), c.view()};
  const ShardResult backward[] = {c.view(), a.view(), b.view()};
  auto f = merge_shards(forward, g_.head_dim);
  auto r = merge_shards(backward, g_.head_dim);
  ASSERT_TRUE(f.ok() && r.ok());
  EXPECT_LT(max_abs_diff(whole.out, f->output), 2e-6);
  EXPECT_LT(max_abs_diff(whole.out, r->output), 2e-6);
  EXPECT_LT(max_abs_diff(whole.lse, f->lse), 2e-6);
  EXPECT_LT(max_abs_diff(whole.lse, r->lse), 2e-6);
}

TEST_F(ShardMergeTest, EmptyShardIsANoOp) {
  const WireShard a = to_wire(reference(0, 100));
  WireShard empty;
  empty.lse.assign(a.lse.size(), -std::numeric_limits<float>::infinity());
  empty.out.assign(a.out.size(), 123.f);  // junk beside LSE -inf must not leak
  const ShardResult shards[] = {empty.view(), a.view(), empty.view()};
  auto merged = merge_shards(shards, g_.head_dim);
  ASSERT_TRUE(merged.ok());
  EXPECT_EQ(merged->output, a.out);  // weights exactly 0 and 1: bit for bit
  for (size_t i = 0; i < a.lse.size(); ++i) EXPECT_NEAR(merged->lse[i], a.lse[i], 1e-6);
}

TEST_F(ShardMergeTest, NoKeysAnywhereGivesZeroAndMinusInfinity) {
  WireShard empty;
  empty.lse.assign(g_.num_q_heads, -std::numeric_limits<float>::infinity());
  empty.out.assign(static_cast<size_t>(g_.num_q_heads) * g_.head_dim, 0.f);
  const ShardResult shards[] = {empty.view(), empty.view()};
  auto merged = merge_shards(shards, g_.head_dim);
  ASSERT_TRUE(merged.ok());
  for (float x : merged->output) EXPECT_EQ(x, 0.f);
  for (float l : merged->lse) EXPECT_EQ(l, -kInf);
}

TEST_F(ShardMergeTest, MismatchedSizesAreRejectedByName) {
  const WireShard a = to_wire(reference(0, 48));
  WireShard b = to_wire(reference(48, 100));
  b.out.pop_back();
  const ShardResult shards[] = {a.view(), b.view()};
  auto merged = merge_shards(shards, g_.head_dim);
  ASSERT_FALSE(merged.ok());
  EXPECT_EQ(merged.error().code(), ErrorCode::kInvalidArgument);
  EXPECT_NE(merged.error().message().find("shards[1].output"), std::string::npos)
      << merged.error().message();
  EXPECT_FALSE(merge_shards({}, g_.head_dim).ok());
}

}  // namespace
}  // namespace pagoda::client
