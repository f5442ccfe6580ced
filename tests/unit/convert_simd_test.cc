// The CPU backend's bulk conversions (kernels/cpu/convert_simd.h) against the
// scalar definitions of pagoda/host_convert.h, bit for bit, on every SIMD
// target the CPU has: all 2^16 fp16 codes in, a million fp32 bit patterns out
// (specials, subnormals, ties and NaNs among them), every tail length.
#include <gtest/gtest.h>
#include <hwy/targets.h>

#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "cpu/convert_simd.h"
#include "cpu/decode_cpu.h"
#include "pagoda/host_convert.h"

namespace pagoda::cpu {
namespace {

uint32_t bits_of(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}
float float_of(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// fp32 inputs: random bit patterns, the fp16 range's edges and every tie
// between neighbouring fp16 values near 1.
std::vector<float> float_inputs() {
  std::mt19937 rng(5);
  std::vector<float> in;
  for (int i = 0; i < 1 << 20; ++i) in.push_back(float_of(rng()));
  for (float f : {0.f, -0.f, 65504.f, 65519.f, 65520.f, -65520.f, 6.1035156e-05f, 5.9604645e-08f, 2.9802322e-08f,
                  2.9802326e-08f, INFINITY, -INFINITY, NAN}) {
    in.push_back(f);
  }
  for (uint32_t m = 0; m < 1u << 13; ++m) in.push_back(float_of(0x3F800000u | (m << 10) | 0x1000u));  // halfway
  return in;
}

class ConvertSimd : public ::testing::TestWithParam<const char*> {
 protected:
  void SetUp() override {
    const Status s = select_simd_target(GetParam());
    if (!s.ok()) GTEST_SKIP() << s.message();
  }
  void TearDown() override { EXPECT_TRUE(select_simd_target("best").ok()); }
};

TEST_P(ConvertSimd, Fp16ToFloatGivesTheScalarBitsForEveryCode) {
  std::vector<uint16_t> codes(1 << 16);
  for (uint32_t c = 0; c < codes.size(); ++c) codes[c] = static_cast<uint16_t>(c);
  std::vector<float> got(codes.size());
  fp16_to_float_n(codes.data(), got.data(), static_cast<int64_t>(codes.size()));
  for (uint32_t c = 0; c < codes.size(); ++c) {
    ASSERT_EQ(bits_of(got[c]), bits_of(fp16_to_float(codes[c]))) << "code 0x" << std::hex << c << " on " << simd_target_name();
  }
}

TEST_P(ConvertSimd, FloatToFp16GivesTheScalarBitsForAMillionPatterns) {
  const std::vector<float> in = float_inputs();
  std::vector<uint16_t> got(in.size());
  float_to_fp16_n(in.data(), got.data(), static_cast<int64_t>(in.size()));
  for (size_t i = 0; i < in.size(); ++i) {
    ASSERT_EQ(got[i], float_to_fp16(in[i])) << "input 0x" << std::hex << bits_of(in[i]) << " on " << simd_target_name();
  }
}

// Every length up to four vectors: the SIMD body and its scalar tail meet
// at every offset.
TEST_P(ConvertSimd, EveryTailLengthAndEveryDtypePairMatchesTheScalarConvert) {
  const std::vector<float> in = float_inputs();
  for (DType from : {DType::kFloat32, DType::kFloat16, DType::kBFloat16}) {
    for (DType to : {DType::kFloat32, DType::kFloat16, DType::kBFloat16}) {
      for (int64_t n = 1; n <= 67; ++n) {
        std::vector<uint8_t> src(static_cast<size_t>(n) * dtype_size(from));
        convert(in.data() + n * 97, DType::kFloat32, src.data(), from, n);
        std::vector<uint8_t> want(static_cast<size_t>(n) * dtype_size(to)), got(want.size());
        convert(src.data(), from, want.data(), to, n);
        convert_n(src.data(), from, got.data(), to, n);
        ASSERT_EQ(got, want) << dtype_name(from) << " -> " << dtype_name(to) << ", n " << n << " on "
                             << simd_target_name();
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Targets, ConvertSimd, ::testing::Values("best", "avx2"),
                         [](const ::testing::TestParamInfo<const char*>& info) { return std::string(info.param); });

}  // namespace
}  // namespace pagoda::cpu
