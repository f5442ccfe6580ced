// pagoda-bench kernel --target relies on this: selecting a target changes the
// kernel that runs, and asking for one the CPU lacks says so.
#include <gtest/gtest.h>
#include <hwy/targets.h>

#include <string>

#include "cpu/decode_cpu.h"

namespace pagoda::cpu {
namespace {

bool has(int64_t target) { return (hwy::SupportedTargets() & target) != 0; }

class SimdTarget : public ::testing::Test {
 protected:
  void TearDown() override { EXPECT_TRUE(select_simd_target("best").ok()); }
};

TEST_F(SimdTarget, Avx2SwitchesTheDispatchedTargetAndBestSwitchesBack) {
  ASSERT_TRUE(select_simd_target("best").ok());
  const std::string best = simd_target_name();
  if (!has(HWY_AVX2)) GTEST_SKIP() << "this CPU has no AVX2; best is " << best;
  ASSERT_TRUE(select_simd_target("avx2").ok());
  EXPECT_STREQ(simd_target_name(), "AVX2");
  ASSERT_TRUE(select_simd_target("best").ok());
  EXPECT_EQ(simd_target_name(), best);
  if (has(HWY_AVX3)) {
    EXPECT_EQ(best, "AVX3") << "an AVX-512 CPU dispatches to AVX3 by default";
  }
}

TEST_F(SimdTarget, Avx3IsThereExactlyWhenTheCpuHasAvx512) {
  const Status s = select_simd_target("avx3");
  if (has(HWY_AVX3)) {
    ASSERT_TRUE(s.ok()) << s.message();
    EXPECT_STREQ(simd_target_name(), "AVX3");
  } else {
    EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition);
    EXPECT_NE(s.message().find("AVX-512"), std::string::npos) << s.message();
  }
}

TEST_F(SimdTarget, UnknownTargetIsInvalidArgumentNamingIt) {
  const Status s = select_simd_target("neon");
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(s.message(), "target: expected best, amx, avx512bf16, avx3 or avx2, received 'neon'");
}

TEST_F(SimdTarget, FmaPeakIsMeasuredAndPlausible) {
  const double one = measure_fma_peak(1);
  EXPECT_GT(one, 1e9);   // any x86 core with FMA does > 1 GFLOP/s
  EXPECT_LT(one, 1e12);  // and < 1 TFLOP/s: more means the loop was optimised away
}

}  // namespace
}  // namespace pagoda::cpu
