#pragma once
// A test run once per named SIMD target of the CPU kernels: the target is
// selected for the test (one this CPU lacks skips, saying which; a name that is
// not a target fails), and "best" is selected again after it.

#include <gtest/gtest.h>

#include <string>

#include "pagoda/cpu_targets.h"
#include "pagoda/status.h"

namespace pagoda::testing {

class OnSimdTarget : public ::testing::TestWithParam<const char*> {
 protected:
  void SetUp() override {
    const Status s = cpu::select_simd_target(GetParam());
    if (s.code() == StatusCode::kFailedPrecondition) GTEST_SKIP() << s.message();
    ASSERT_TRUE(s.ok()) << s.message();
  }
  void TearDown() override { EXPECT_TRUE(cpu::select_simd_target("best").ok()); }
};

// The test's name suffix: the target's.
inline std::string simd_target_name(const ::testing::TestParamInfo<const char*>& info) { return info.param; }

}  // namespace pagoda::testing
