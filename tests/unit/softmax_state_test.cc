// The online-softmax state and its merge, checked against direct sums.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>
#include <vector>

#include "pagoda/softmax_state.h"

namespace pagoda {
namespace {

constexpr int kDim = 8;

// The state of a block of natural-log scores, built directly (no merge).
template <typename T>
SoftmaxState<T, kDim> block_state(const std::vector<double>& scores, const std::vector<std::vector<double>>& v,
                                  size_t begin, size_t end) {
  SoftmaxState<T, kDim> s;
  for (size_t i = begin; i < end; ++i) s.stats.m = std::max(s.stats.m, static_cast<T>(scores[i] * kLog2e));
  for (size_t i = begin; i < end; ++i) {
    const T p = exp2_of(static_cast<T>(scores[i] * kLog2e) - s.stats.m);
    s.stats.l += p;
    for (int d = 0; d < kDim; ++d) s.acc[d] += p * static_cast<T>(v[i][d]);
  }
  return s;
}

TEST(SoftmaxState, SeedWorkedExample) {
  // Scores [3, 1] then [5, 2]; the state's l is invariant under the base change.
  const std::vector<double> scores = {3, 1, 5, 2};
  const std::vector<std::vector<double>> v(4, std::vector<double>(kDim, 1.0));
  auto a = block_state<double>(scores, v, 0, 2);
  EXPECT_NEAR(a.stats.l, 1.1353, 5e-5);
  a.merge(block_state<double>(scores, v, 2, 4));
  EXPECT_NEAR(a.stats.l, 1.2034, 5e-5);
  const double direct = std::exp(3 - 5.) + std::exp(1 - 5.) + std::exp(5 - 5.) + std::exp(2 - 5.);
  EXPECT_NEAR(a.stats.l, direct, 1e-15);
  EXPECT_NEAR(a.lse(), 5 + std::log(direct), 1e-15);
}

TEST(SoftmaxState, EmptyStatesMergeWithoutNaN) {
  SoftmaxState<float, kDim> a, b;
  a.merge(b);
  EXPECT_EQ(a.stats.m, -INFINITY);
  EXPECT_EQ(a.stats.l, 0.f);
  for (float x : a.acc) EXPECT_EQ(x, 0.f);
  EXPECT_EQ(a.lse(), -INFINITY);
  EXPECT_EQ(inverse_sum(a.stats.l), 0.f);
}

TEST(SoftmaxState, MergingAnEmptyStateIsABitExactNoOp) {
  const std::vector<double> scores = {0.3, -2.5, 7.25};
  std::vector<std::vector<double>> v(3, std::vector<double>(kDim));
  for (size_t i = 0; i < 3; ++i)
    for (int d = 0; d < kDim; ++d) v[i][d] = 0.1 * (d + 1) - 0.37 * i;
  const auto full = block_state<float>(scores, v, 0, 3);
  SoftmaxState<float, kDim> empty;
  auto left = empty;
  left.merge(full);   // empty then full (the first chunk of every merge)
  auto right = full;
  right.merge(empty);  // full then a fully masked chunk
  for (const auto* s : {&left, &right}) {
    EXPECT_EQ(s->stats.m, full.stats.m);
    EXPECT_EQ(s->stats.l, full.stats.l);
    for (int d = 0; d < kDim; ++d) EXPECT_EQ(s->acc[d], full.acc[d]);
  }
}

// 1,000 keys with score standard deviation 30, cut into uneven blocks including
// one of length 1 and one fully masked (empty), merged in several orders.
class MergeOrders : public ::testing::Test {
 protected:
  void SetUp() override {
    std::mt19937_64 rng(42);
    std::normal_distribution<double> score(0, 30), value(0, 1);
    scores_.resize(1000);
    v_.assign(1000, std::vector<double>(kDim));
    for (size_t i = 0; i < 1000; ++i) {
      scores_[i] = score(rng);
      for (double& x : v_[i]) x = value(rng);
    }
    // The row max sits in the last block: a merge that forgets to rescale the
    // accumulator of the earlier blocks would still pass otherwise.
    scores_[999] = *std::max_element(scores_.begin(), scores_.end()) + 5;
    bounds_ = {0, 1, 1, 130, 131, 400, 612, 613, 900, 1000};  // [1,1) is the masked block
  }

  // Direct two-pass softmax in double: output and natural LSE.
  void direct(std::vector<double>& out, double& lse) const {
    const double mx = *std::max_element(scores_.begin(), scores_.end());
    double sum = 0;
    out.assign(kDim, 0);
    for (size_t i = 0; i < scores_.size(); ++i) sum += std::exp(scores_[i] - mx);
    for (size_t i = 0; i < scores_.size(); ++i)
      for (int d = 0; d < kDim; ++d) out[d] += std::exp(scores_[i] - mx) / sum * v_[i][d];
    lse = mx + std::log(sum);
  }

  template <typename T>
  std::vector<SoftmaxState<T, kDim>> blocks() const {
    std::vector<SoftmaxState<T, kDim>> b;
    for (size_t i = 0; i + 1 < bounds_.size(); ++i) b.push_back(block_state<T>(scores_, v_, bounds_[i], bounds_[i + 1]));
    return b;
  }

  template <typename T>
  static SoftmaxState<T, kDim> merge_in_order(const std::vector<SoftmaxState<T, kDim>>& parts,
                                              const std::vector<size_t>& order) {
    SoftmaxState<T, kDim> s;
    for (size_t i : order) s.merge(parts[i]);
    return s;
  }

  template <typename T>
  static SoftmaxState<T, kDim> merge_tree(std::vector<SoftmaxState<T, kDim>> parts) {
    while (parts.size() > 1) {
      std::vector<SoftmaxState<T, kDim>> next;
      for (size_t i = 0; i < parts.size(); i += 2) {
        if (i + 1 < parts.size()) parts[i].merge(parts[i + 1]);
        next.push_back(parts[i]);
      }
      parts = std::move(next);
    }
    return parts[0];
  }

  template <typename T>
  void check_all_orders(double out_tol, double lse_tol) const {
    std::vector<double> want;
    double want_lse;
    direct(want, want_lse);
    const auto parts = blocks<T>();
    std::vector<size_t> order(parts.size());
    std::iota(order.begin(), order.end(), 0);
    std::vector<size_t> reversed(order.rbegin(), order.rend());
    std::vector<size_t> shuffled = order;
    std::shuffle(shuffled.begin(), shuffled.end(), std::mt19937_64(7));
    const std::pair<const char*, SoftmaxState<T, kDim>> results[] = {
        {"sequential", merge_in_order(parts, order)},
        {"reversed", merge_in_order(parts, reversed)},
        {"shuffled", merge_in_order(parts, shuffled)},
        {"tree", merge_tree(parts)},
    };
    for (const auto& [name, s] : results) {
      SCOPED_TRACE(name);
      EXPECT_NEAR(s.lse(), want_lse, lse_tol);
      for (int d = 0; d < kDim; ++d) EXPECT_NEAR(s.acc[d] * inverse_sum(s.stats.l), want[d], out_tol);
    }
  }

  std::vector<double> scores_;
  std::vector<std::vector<double>> v_;
  std::vector<size_t> bounds_;
};

TEST_F(MergeOrders, DoubleMatchesDirectSoftmax) {
  // Each of the ~10 merges and ~1,000 accumulations rounds at 2^-53 relative on
  // values of magnitude ~1: 1e-13 leaves two orders of margin over the seed's
  // observed 1.3e-15 while a wrong weight is off by O(1).
  check_all_orders<double>(1e-13, 1e-12);
}

TEST_F(MergeOrders, FloatMatchesDirectSoftmax) {
  // fp32 accumulation of up to ~500 terms per block at 2^-24 relative
  // (~6e-8 x 500 x |v| <= 4) bounds the output error near 1e-5; the LSE carries
  // the max exactly (~100 in magnitude, ulp 7.6e-6) plus log2 of the sum.
  check_all_orders<float>(2e-5, 3e-5);
}

TEST_F(MergeOrders, MissingAccumulatorRescaleIsCaught) {
  // A merge that rescales l but not acc must fail this comparison: proof that
  // the max-in-last-block data can tell the two apart.
  std::vector<double> want;
  double want_lse;
  direct(want, want_lse);
  const auto parts = blocks<double>();
  SoftmaxState<double, kDim> s;
  for (const auto& p : parts) {
    const MergeWeights<double> w = merge_weights(s.stats.m, p.stats.m);
    s.stats.m = w.m;
    s.stats.l = s.stats.l * w.a + p.stats.l * w.b;
    for (int d = 0; d < kDim; ++d) s.acc[d] = s.acc[d] + p.acc[d] * w.b;  // acc not rescaled
  }
  double max_err = 0;
  for (int d = 0; d < kDim; ++d) max_err = std::max(max_err, std::abs(s.acc[d] / s.stats.l - want[d]));
  EXPECT_GT(max_err, 1e-3);
}

}  // namespace
}  // namespace pagoda
