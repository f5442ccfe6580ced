// Wire tensors: fp32 values to little-endian bytes of each dtype and back.
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

#include <gtest/gtest.h>

#include "pagoda/client/tensor.h"

namespace pagoda::client {
namespace {

uint16_t half_word(const std::string& bytes, size_t i) {
  return static_cast<uint16_t>(static_cast<uint8_t>(bytes[2 * i]) |
                               (static_cast<uint8_t>(bytes[2 * i + 1]) << 8));
}

TEST(TensorCodec, Fp32IsTheRawLittleEndianBytes) {
  const std::vector<float> values = {1.f, -2.5f, 3.0e-38f, std::numeric_limits<float>::infinity()};
  const std::string bytes = encode_values(values, DType::kFloat32);
  ASSERT_EQ(bytes.size(), 16u);
  // 1.0f = 0x3F800000, stored least significant byte first.
  EXPECT_EQ(static_cast<uint8_t>(bytes[0]), 0x00);
  EXPECT_EQ(static_cast<uint8_t>(bytes[3]), 0x3F);
  EXPECT_EQ(static_cast<uint8_t>(bytes[2]), 0x80);
  auto back = decode_values(bytes, DType::kFloat32, 4, "t");
  ASSERT_TRUE(back.ok()) << back.error().to_string();
  EXPECT_EQ(std::memcmp(back->data(), values.data(), 16), 0);
}

TEST(TensorCodec, Fp16KnownBitPatterns) {
  const std::vector<float> values = {1.f, -2.f, 65504.f, 0.f, 1.f / 16384.f /* 2^-14, smallest normal */};
  const std::string bytes = encode_values(values, DType::kFloat16);
  ASSERT_EQ(bytes.size(), 10u);
  EXPECT_EQ(half_word(bytes, 0), 0x3C00);
  EXPECT_EQ(half_word(bytes, 1), 0xC000);
  EXPECT_EQ(half_word(bytes, 2), 0x7BFF);
  EXPECT_EQ(half_word(bytes, 3), 0x0000);
  EXPECT_EQ(half_word(bytes, 4), 0x0400);
  auto back = decode_values(bytes, DType::kFloat16, 5, "t");
  ASSERT_TRUE(back.ok());
  EXPECT_EQ(*back, values);  // all exactly representable
}

TEST(TensorCodec, Bf16KnownBitPatternsAndRounding) {
  // 1 + 2^-8 lies halfway between two bf16 values: ties go to even (1.0).
  const std::vector<float> values = {1.f, -2.f, 1.f + std::ldexp(1.f, -8), 1.f + 3 * std::ldexp(1.f, -8)};
  const std::string bytes = encode_values(values, DType::kBFloat16);
  EXPECT_EQ(half_word(bytes, 0), 0x3F80);
  EXPECT_EQ(half_word(bytes, 1), 0xC000);
  EXPECT_EQ(half_word(bytes, 2), 0x3F80);
  EXPECT_EQ(half_word(bytes, 3), 0x3F82);
}

TEST(TensorCodec, RoundToDtypeEqualsAWireRoundTrip) {
  std::vector<float> values;
  for (int i = -50; i < 50; ++i) values.push_back(0.0137f * static_cast<float>(i * i * i));
  for (DType t : {DType::kFloat32, DType::kFloat16, DType::kBFloat16}) {
    auto back = decode_values(encode_values(values, t), t, static_cast<int64_t>(values.size()), "t");
    ASSERT_TRUE(back.ok());
    EXPECT_EQ(round_to_dtype(values, t), *back) << dtype_name(t);
  }
  // fp16 keeps 11 significant bits: a round trip moves a value by at most half an ulp.
  const auto r = round_to_dtype(values, DType::kFloat16);
  for (size_t i = 0; i < values.size(); ++i)
    EXPECT_LE(std::abs(r[i] - values[i]), std::abs(values[i]) * std::ldexp(1.f, -11)) << values[i];
}

TEST(TensorCodec, WrongByteCountNamesFieldAndSizes) {
  auto r = decode_values(std::string(10, '\0'), DType::kFloat32, 3, "output");
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().code(), ErrorCode::kInvalidArgument);
  EXPECT_NE(r.error().message().find("output.data"), std::string::npos) << r.error().message();
  EXPECT_NE(r.error().message().find("expected 12 bytes"), std::string::npos) << r.error().message();
  EXPECT_NE(r.error().message().find("received 10"), std::string::npos) << r.error().message();
}

TEST(TensorCodec, WireDtypeNumbers) {
  EXPECT_EQ(wire_dtype(DType::kFloat32), 1);
  EXPECT_EQ(wire_dtype(DType::kFloat16), 2);
  EXPECT_EQ(wire_dtype(DType::kBFloat16), 3);
  for (int n = 1; n <= 3; ++n) {
    auto t = dtype_from_wire(n, "q");
    ASSERT_TRUE(t.ok());
    EXPECT_EQ(wire_dtype(*t), n);
  }
  auto unspecified = dtype_from_wire(0, "q");
  ASSERT_FALSE(unspecified.ok());
  EXPECT_NE(unspecified.error().message().find("q.dtype"), std::string::npos);
  EXPECT_FALSE(dtype_from_wire(7, "q").ok());
}

TEST(TensorCodec, ElementCount) {
  const std::vector<int64_t> shape = {3, 8, 64};
  EXPECT_EQ(element_count(shape), 3 * 8 * 64);
  EXPECT_EQ(element_count({}), 1);
}

}  // namespace
}  // namespace pagoda::client
