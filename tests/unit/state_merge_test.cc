// merge_state (cpu/state_merge.h), the CPU backend's one merge of two partial
// states, in SIMD vectors: on every target the CPU has, each accumulator
// element has exactly the bits of a * wa + b * wb with each product and the
// sum rounded once, the statistics those of merge_weights, and an empty state
// on either side leaves the other's bits (-0 included). A fused multiply-add
// rounds the sum once and moves the last bit of some elements, so the
// comparison is bit for bit.
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <random>
#include <utility>
#include <vector>

#include "cpu/state_merge.h"
#include "unit/on_simd_target.h"

namespace pagoda::testing {
namespace {

// The weighted sum with its three roundings spelled out: each step stored
// through a volatile, so that no step is fused with the next.
float rounded_sum(float x, float wa, float y, float wb) {
  volatile float px = x * wa;
  volatile float py = y * wb;
  volatile float sum = px + py;
  return sum;
}

struct Merged {
  SoftmaxStats<float> stats;
  std::vector<float> acc;
};

Merged merge(SoftmaxStats<float> a, std::vector<float> acc_a, const SoftmaxStats<float>& b,
             const std::vector<float>& acc_b) {
  cpu::merge_state(a, acc_a.data(), b, acc_b.data(), static_cast<int>(acc_a.size()));
  return {a, std::move(acc_a)};
}

class MergeStateOnTarget : public OnSimdTarget {};

TEST_P(MergeStateOnTarget, EveryElementHasTheUnfusedSumsBits) {
  std::mt19937 rng(23);
  std::uniform_real_distribution<float> value(-4.f, 4.f);
  std::uniform_real_distribution<float> max(-20.f, 20.f);
  // Lengths below, at and past whole vectors of 4, 8 and 16 lanes, and the
  // head widths of the vocabulary.
  for (const int n : {1, 3, 8, 15, 16, 17, 33, 64, 100, 128, 256, 512, 576}) {
    for (int trial = 0; trial < 8; ++trial) {
      const SoftmaxStats<float> a{max(rng), 1.f + std::abs(value(rng))};
      const SoftmaxStats<float> b{max(rng), 1.f + std::abs(value(rng))};
      std::vector<float> acc_a(n), acc_b(n);
      for (float& x : acc_a) x = value(rng);
      for (float& x : acc_b) x = value(rng);
      const Merged got = merge(a, acc_a, b, acc_b);

      const MergeWeights<float> w = merge_weights(a.m, b.m);
      EXPECT_EQ(std::bit_cast<uint32_t>(got.stats.m), std::bit_cast<uint32_t>(w.m)) << "n " << n;
      EXPECT_EQ(std::bit_cast<uint32_t>(got.stats.l), std::bit_cast<uint32_t>(rounded_sum(a.l, w.a, b.l, w.b)))
          << "n " << n;
      int differing = 0;
      for (int i = 0; i < n; ++i) {
        const float want = rounded_sum(acc_a[i], w.a, acc_b[i], w.b);
        differing += std::bit_cast<uint32_t>(got.acc[i]) != std::bit_cast<uint32_t>(want);
      }
      EXPECT_EQ(differing, 0) << "elements of " << n << " off the unfused sum's bits, trial " << trial;
    }
  }
}

TEST_P(MergeStateOnTarget, AnEmptySideLeavesTheOtherBitForBit) {
  const SoftmaxStats<float> empty{};
  const SoftmaxStats<float> full{3.5f, 2.25f};
  const std::vector<float> zeros(40, -0.f);  // an empty state's accumulator of -0
  std::vector<float> values(40);
  for (int i = 0; i < 40; ++i) values[i] = i % 3 == 0 ? -0.f : 0.5f * static_cast<float>(i) - 7.f;

  const Merged into_empty = merge(empty, zeros, full, values);
  EXPECT_EQ(into_empty.stats.m, full.m);
  EXPECT_EQ(into_empty.stats.l, full.l);
  const Merged from_empty = merge(full, values, empty, zeros);
  EXPECT_EQ(from_empty.stats.m, full.m);
  EXPECT_EQ(from_empty.stats.l, full.l);
  for (int i = 0; i < 40; ++i) {
    EXPECT_EQ(std::bit_cast<uint32_t>(into_empty.acc[i]), std::bit_cast<uint32_t>(values[i])) << i;
    EXPECT_EQ(std::bit_cast<uint32_t>(from_empty.acc[i]), std::bit_cast<uint32_t>(values[i])) << i;
  }
}

INSTANTIATE_TEST_SUITE_P(Targets, MergeStateOnTarget, ::testing::Values("best", "avx3", "avx2"), simd_target_name);

}  // namespace
}  // namespace pagoda::testing
