// The softmax's weights 2^x (x a score minus its row's max, so x <= 0) on each
// SIMD target the CPU has, against std::exp2 in double.
//
// The bound, 1.65 * 2^-24 relative. exp2_nonpositive splits x = n + f with n
// an integer and f in [-1/2, 1/2], both exact (x - round(x) is representable),
// evaluates 2^f by Horner's rule in fp32 FMAs over fp32 coefficients, and
// multiplies by 2^n, exactly: for x >= -126 the result is a normal float, and
// below -126 the weight is 0 by design.
// - The fp32 coefficients' polynomial differs from 2^f by at most 0.143 *
//   2^-24 relative on [-1/2, 1/2] (evaluated in double at 200,001 points).
// - Horner's rule with one rounding a step: with p_k the k-th partial value,
//   |error| <= 2^-24 * sum_k |p_k(f)| |f|^(7-k) (k = 1..7; the leading
//   coefficient is not rounded), which is at most 1.5 * 2^-24 * 2^f on
//   [-1/2, 1/2] (its maximum, at f = -1/2).
// Together under 1.65 * 2^-24 relative to 2^x (the products of two errors are
// below 2^-46). A wrong split (n off by one, f outside [-1/2, 1/2]) or a
// dropped term moves the weight by far more.
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <set>
#include <string>
#include <vector>

#include "cpu/decode_cpu.h"

namespace pagoda::cpu {
namespace {

constexpr double kBound = 1.65 * 0x1p-24;

class SoftmaxExp2 : public ::testing::Test {
 protected:
  void TearDown() override { EXPECT_TRUE(select_simd_target("best").ok()); }

  // The targets this CPU can dispatch to, each once, selected in turn.
  template <class F>
  void on_each_target(F check) {
    std::set<std::string> seen;
    for (const char* target : {"best", "avx3", "avx2"}) {
      if (!select_simd_target(target).ok()) continue;
      if (!seen.insert(simd_target_name()).second) continue;
      SCOPED_TRACE(simd_target_name());
      check();
    }
    EXPECT_FALSE(seen.empty());
  }
};

float from_bits(uint32_t b) { return std::bit_cast<float>(b); }
uint32_t bits_of(float x) { return std::bit_cast<uint32_t>(x); }

// Floats in [-126, 0]: every 97th bit pattern from -0 down (about 86,000 a
// binade, the low significand bits varied), and every float within 512 ulps of
// each integer and half-integer, where n steps and f reaches +-1/2.
std::vector<float> sweep() {
  std::vector<float> xs;
  const uint32_t last = bits_of(-126.f);
  for (uint32_t b = bits_of(-0.f); b <= last; b += 97) xs.push_back(from_bits(b));
  for (int k = 0; k <= 252; ++k) {
    const uint32_t at = bits_of(-0.5f * static_cast<float>(k));
    for (uint32_t d = 0; d <= 512; ++d) {
      if (at >= bits_of(-0.f) + d) xs.push_back(from_bits(at - d));  // toward 0
      if (at + d <= last) xs.push_back(from_bits(at + d));            // away from 0
    }
  }
  return xs;
}

TEST_F(SoftmaxExp2, EveryTargetIsWithinItsDerivedBoundOverMinus126ToZero) {
  const std::vector<float> xs = sweep();
  std::vector<float> out(xs.size());
  on_each_target([&] {
    softmax_exp2(xs.data(), out.data(), static_cast<int64_t>(xs.size()));
    double worst = 0;
    float worst_x = 0;
    int64_t over = 0;
    for (size_t i = 0; i < xs.size(); ++i) {
      const double exact = std::exp2(static_cast<double>(xs[i]));
      const double rel = std::abs(static_cast<double>(out[i]) - exact) / exact;
      if (rel > worst) worst = rel, worst_x = xs[i];
      over += rel > kBound;
    }
    EXPECT_EQ(over, 0) << "of " << xs.size() << " weights past " << kBound << " relative; worst " << worst
                       << " at x = " << worst_x;
    EXPECT_GT(worst, 0.0) << "no rounding at all over the sweep: the comparison is not reaching the kernel";
  });
}

TEST_F(SoftmaxExp2, IntegersAreExactPowersOfTwoAndBelowMinus126IsZero) {
  std::vector<float> xs;
  for (int k = 0; k <= 126; ++k) xs.push_back(-static_cast<float>(k));
  const std::vector<float> under = {std::nextafter(-126.f, -200.f), -126.5f, -127.f, -149.f, -1000.f,
                                    -std::numeric_limits<float>::max(), -std::numeric_limits<float>::infinity()};
  xs.insert(xs.end(), under.begin(), under.end());
  on_each_target([&] {
    std::vector<float> out(xs.size(), -1.f);
    softmax_exp2(xs.data(), out.data(), static_cast<int64_t>(xs.size()));
    for (int k = 0; k <= 126; ++k) EXPECT_EQ(out[k], std::ldexp(1.f, -k)) << "x = " << -k;
    for (size_t i = 127; i < xs.size(); ++i) {
      EXPECT_EQ(bits_of(out[i]), 0u) << "x = " << xs[i] << " gives " << out[i] << ", expected +0";
    }
  });
}

// A count that is not a whole number of vectors: the tail gets its weights too,
// and nothing past it is written.
TEST_F(SoftmaxExp2, TailShorterThanAVectorIsComputedAndNothingPastItWritten) {
  on_each_target([&] {
    for (int64_t n = 1; n <= 37; ++n) {
      std::vector<float> xs(n);
      for (int64_t i = 0; i < n; ++i) xs[i] = -0.25f * static_cast<float>(i);
      std::vector<float> out(n + 1, 7.f);
      softmax_exp2(xs.data(), out.data(), n);
      for (int64_t i = 0; i < n; ++i) {
        const double exact = std::exp2(static_cast<double>(xs[i]));
        EXPECT_LE(std::abs(out[i] - exact), kBound * exact) << "n = " << n << ", i = " << i;
      }
      EXPECT_EQ(out[n], 7.f) << "n = " << n << ": written past the end";
    }
  });
}

}  // namespace
}  // namespace pagoda::cpu
