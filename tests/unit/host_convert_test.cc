#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <vector>

#include "pagoda/host_convert.h"

namespace pagoda {
namespace {

TEST(HostConvert, Fp16KnownValues) {
  EXPECT_EQ(float_to_fp16(1.0f), 0x3c00);
  EXPECT_EQ(float_to_fp16(-2.0f), 0xc000);
  EXPECT_EQ(float_to_fp16(65504.f), 0x7bff);
  EXPECT_EQ(fp16_to_float(0x3555), 0.333251953125f);
  // 1 + 2^-11 is halfway between 1 and 1 + 2^-10: ties go to even (1).
  EXPECT_EQ(float_to_fp16(1.0f + std::ldexp(1.f, -11)), 0x3c00);
  EXPECT_EQ(float_to_fp16(1.0f + 3 * std::ldexp(1.f, -11)), 0x3c02);
}

TEST(HostConvert, Bf16RoundsToNearestEven) {
  EXPECT_EQ(float_to_bf16(1.0f), 0x3f80);
  // 1 + 2^-8 is halfway between 1 and 1 + 2^-7: ties to even (1).
  EXPECT_EQ(float_to_bf16(1.0f + std::ldexp(1.f, -8)), 0x3f80);
  EXPECT_EQ(float_to_bf16(1.0f + 3 * std::ldexp(1.f, -8)), 0x3f82);
  EXPECT_EQ(float_to_bf16(1.0f + std::ldexp(1.f, -8) + std::ldexp(1.f, -20)), 0x3f81);
  EXPECT_TRUE(std::isnan(bf16_to_float(float_to_bf16(NAN))));
  EXPECT_EQ(bf16_to_float(0x4049), 3.140625f);
}

TEST(HostConvert, RoundTripsThroughEveryDtype) {
  const float in[] = {0.f, -0.5f, 1.75f, 1024.f, -3.140625f};
  for (DType t : {DType::kFloat32, DType::kFloat16, DType::kBFloat16}) {
    uint8_t buf[sizeof in];
    float back[5];
    convert(in, DType::kFloat32, buf, t, 5);
    convert(buf, t, back, DType::kFloat32, 5);
    EXPECT_EQ(std::memcmp(in, back, sizeof in), 0) << dtype_name(t);
  }
}

}  // namespace
}  // namespace pagoda

namespace pagoda {
namespace {

}  // namespace
}  // namespace pagoda
