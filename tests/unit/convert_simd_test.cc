// The bulk conversions of pagoda/host_convert.h (SIMD, dispatched at run time)
// against its element functions, bit for bit, on every SIMD target the CPU
// has: all 2^16 fp16 and bf16 codes in, a million fp32 bit patterns out
// (specials, subnormals, ties and NaNs among them), every tail length and
// dtype pair; and the non-finite scan at every position.
#include <gtest/gtest.h>
#include <hwy/targets.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "cpu/decode_cpu.h"
#include "pagoda/fp8.h"
#include "pagoda/host_convert.h"
#include "unit/on_simd_target.h"

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
  // bf16: every tie between neighbours near 1 and near the largest finite
  // value (whose upward tie rounds to infinity), and NaNs whose payload lies
  // only in the bits bf16 drops.
  for (uint32_t m = 0; m < 1u << 7; ++m) {
    in.push_back(float_of(0x3F800000u | (m << 16) | 0x8000u));
    in.push_back(float_of(0xFF000000u | (m << 16) | 0x8000u));
  }
  for (uint32_t bits : {0x7F7FFFFFu, 0x7F7F8000u, 0x7F7F7FFFu, 0x7F800001u, 0xFF800001u, 0x7FC00000u, 0x00008000u,
                        0x00018000u, 0x80008000u}) {
    in.push_back(float_of(bits));
  }
  return in;
}

class ConvertSimd : public pagoda::testing::OnSimdTarget {};

// Every 16-bit code of `from` in bulk against `element`, bit for bit.
void expect_every_code_widens_as(DType from, float (*element)(uint16_t)) {
  std::vector<uint16_t> codes(1 << 16);
  for (uint32_t c = 0; c < codes.size(); ++c) codes[c] = static_cast<uint16_t>(c);
  std::vector<float> got(codes.size());
  convert_to_float(codes.data(), from, got.data(), static_cast<int64_t>(codes.size()));
  for (uint32_t c = 0; c < codes.size(); ++c) {
    ASSERT_EQ(bits_of(got[c]), bits_of(element(codes[c])))
        << dtype_name(from) << " code 0x" << std::hex << c << " on " << simd_target_name();
  }
}

// The million fp32 patterns in bulk to 16-bit `to` against `element`.
void expect_patterns_narrow_as(DType to, uint16_t (*element)(float)) {
  const std::vector<float> in = float_inputs();
  std::vector<uint16_t> got(in.size());
  convert_from_float(in.data(), got.data(), to, static_cast<int64_t>(in.size()));
  for (size_t i = 0; i < in.size(); ++i) {
    ASSERT_EQ(got[i], element(in[i])) << dtype_name(to) << " input 0x" << std::hex << bits_of(in[i]) << " on "
                                      << simd_target_name();
  }
}

TEST_P(ConvertSimd, Fp16ToFloatGivesTheScalarBitsForEveryCode) {
  expect_every_code_widens_as(DType::kFloat16, fp16_to_float);
}

TEST_P(ConvertSimd, FloatToFp16GivesTheScalarBitsForAMillionPatterns) {
  expect_patterns_narrow_as(DType::kFloat16, float_to_fp16);
}

TEST_P(ConvertSimd, Bf16ToFloatGivesTheScalarBitsForEveryCode) {
  expect_every_code_widens_as(DType::kBFloat16, bf16_to_float);
}

TEST_P(ConvertSimd, FloatToBf16GivesTheScalarBitsForAMillionPatterns) {
  expect_patterns_narrow_as(DType::kBFloat16, float_to_bf16);
  // The rounding itself, independently of float_to_bf16: a tie goes to the
  // even neighbour, a NaN stays a quiet NaN of its sign, the largest finite
  // float rounds up to infinity.
  const float cases[] = {float_of(0x3F808000u), float_of(0x3F818000u), float_of(0x7F800001u), float_of(0xFF800001u),
                         float_of(0x7F7FFFFFu)};
  const uint16_t want[] = {0x3F80, 0x3F82, 0x7FC0, 0xFFC0, 0x7F80};
  uint16_t out[5];
  convert_from_float(cases, out, DType::kBFloat16, 5);
  for (int i = 0; i < 5; ++i) EXPECT_EQ(out[i], want[i]) << "case " << i << " on " << simd_target_name();
}

// The scan finds the first NaN or infinity wherever it lies (the SIMD body
// and the tail), before a later one, from a start of any alignment, and
// reports -1 for finite data: the largest finite value, subnormals and -0.
// e4m3 has no infinity: its special codes are the NaN of each sign.
TEST_P(ConvertSimd, FirstNonFiniteFindsTheFirstSpecialAtEveryPosition) {
  struct Case {
    DType dtype;
    std::vector<uint32_t> finite;   // words that are not special
    std::vector<uint32_t> special;  // infinities and NaNs
  };
  const Case cases[] = {
      {DType::kFloat32,
       {0x3F800000u, 0x7F7FFFFFu, 0x00000001u, 0x80000000u},
       {0x7F800000u, 0xFF800000u, 0x7FC00000u, 0x7F800001u}},
      {DType::kFloat16, {0x3C00u, 0x7BFFu, 0x0001u, 0x8000u}, {0x7C00u, 0xFC00u, 0x7E00u, 0x7C01u}},
      {DType::kBFloat16, {0x3F80u, 0x7F7Fu, 0x0001u, 0x8000u}, {0x7F80u, 0xFF80u, 0x7FC0u, 0x7F81u}},
      {DType::kFloat8E4M3, {0x7Eu, 0xFEu, 0x01u, 0x80u, 0x78u}, {0x7Fu, 0xFFu}},
      {DType::kFloat8E5M2, {0x7Bu, 0xFBu, 0x01u, 0x80u}, {0x7Cu, 0xFCu, 0x7Eu, 0x7Du}},
  };
  for (const Case& c : cases) {
    const size_t word = dtype_size(c.dtype);
    for (int64_t n : {1, 7, 16, 33, 67, 200}) {
      for (size_t offset : {size_t{0}, size_t{1}}) {  // an odd start: wire bytes carry no alignment
        std::vector<uint8_t> buf(offset + static_cast<size_t>(n) * word);
        const auto put = [&](int64_t i, uint32_t w) {
          std::memcpy(&buf[offset + static_cast<size_t>(i) * word], &w, word);  // the word's low bytes (x86)
        };
        for (int64_t i = 0; i < n; ++i) put(i, c.finite[static_cast<size_t>(i) % c.finite.size()]);
        ASSERT_EQ(first_non_finite(buf.data() + offset, c.dtype, n), -1) << dtype_name(c.dtype) << " n " << n;
        for (int64_t at = 0; at < n; ++at) {
          const uint32_t bad = c.special[static_cast<size_t>(at) % c.special.size()];
          put(at, bad);
          if (at + 3 < n) put(at + 3, c.special[0]);  // a later one does not hide the first
          ASSERT_EQ(first_non_finite(buf.data() + offset, c.dtype, n), at)
              << dtype_name(c.dtype) << " n " << n << " offset " << offset << " on " << simd_target_name();
          put(at, c.finite[0]);
          if (at + 3 < n) put(at + 3, c.finite[0]);
        }
      }
    }
  }
  EXPECT_EQ(first_non_finite(nullptr, DType::kBFloat16, 0), -1);
}

// One element of `from` as fp32, and fp32 to `to`, by the element functions.
float element_to_float(const uint8_t* p, DType from) {
  uint16_t h = 0;
  if (dtype_size(from) == 2) std::memcpy(&h, p, sizeof h);
  switch (from) {
    case DType::kFloat32: {
      float f;
      std::memcpy(&f, p, sizeof f);
      return f;
    }
    case DType::kFloat16: return fp16_to_float(h);
    case DType::kBFloat16: return bf16_to_float(h);
    default: return fp8_to_float(*p, from);
  }
}
void element_from_float(float f, uint8_t* p, DType to) {
  uint16_t h = 0;
  switch (to) {
    case DType::kFloat32: std::memcpy(p, &f, sizeof f); return;
    case DType::kFloat16: h = float_to_fp16(f); break;
    case DType::kBFloat16: h = float_to_bf16(f); break;
    default: *p = float_to_fp8(f, to).code; return;
  }
  std::memcpy(p, &h, sizeof h);
}

// Every length up to four vectors: the SIMD body and its scalar tail meet at
// every offset. Each bulk path against the element functions one at a time.
TEST_P(ConvertSimd, EveryTailLengthAndEveryDtypePairMatchesTheElementFunctions) {
  const std::vector<float> in = float_inputs();
  for (const DTypeInfo& from_info : kDTypes) {
    for (const DTypeInfo& to_info : kDTypes) {
      const DType from = from_info.type, to = to_info.type;
      const size_t fs = dtype_size(from), ts = dtype_size(to);
      for (int64_t n = 1; n <= 67; ++n) {
        std::vector<uint8_t> src(static_cast<size_t>(n) * fs);
        for (int64_t i = 0; i < n; ++i) element_from_float(in[static_cast<size_t>(n * 97 + i)], &src[i * fs], from);
        std::vector<uint8_t> want(static_cast<size_t>(n) * ts), got(want.size());
        for (int64_t i = 0; i < n; ++i) element_from_float(element_to_float(&src[i * fs], from), &want[i * ts], to);
        if (from == to) want = src;  // a copy: NaN codes keep their sign and payload
        convert(src.data(), from, got.data(), to, n);
        ASSERT_EQ(got, want) << dtype_name(from) << " -> " << dtype_name(to) << ", n " << n << " on "
                             << simd_target_name();
      }
    }
  }
}

// store_scaled: the element functions on src / scale, and the saturation count.
TEST_P(ConvertSimd, StoreScaledDividesThenRoundsAndCountsSaturation) {
  const std::vector<float> in = float_inputs();
  for (const DTypeInfo& to_info : kDTypes) {
    const DType to = to_info.type;
    const size_t ts = dtype_size(to);
    const int64_t n = 1000;
    const float scale = 0.37f;
    std::vector<uint8_t> want(static_cast<size_t>(n) * ts), got(want.size());
    int64_t want_saturated = 0;
    for (int64_t i = 0; i < n; ++i) {
      const float x = in[static_cast<size_t>(i)] / scale;
      element_from_float(x, &want[i * ts], to);
      if (is_fp8(to)) want_saturated += float_to_fp8(x, to).saturated;
    }
    const int64_t saturated = store_scaled(in.data(), DType::kFloat32, scale, got.data(), to, n);
    ASSERT_EQ(got, want) << dtype_name(to) << " on " << simd_target_name();
    EXPECT_EQ(saturated, want_saturated) << dtype_name(to);
    if (is_fp8(to)) {
      EXPECT_GT(saturated, 0) << "random bit patterns include huge values";
    }
  }
}

// fp32 to fp8 in bulk (the append path into an fp8 cache) against
// float_to_fp8 for the million patterns and, for each format, every code's
// value, every midpoint between neighbouring codes (ties to even) and the
// floats either side of it, both signs, with the saturation count.
TEST_P(ConvertSimd, FloatToFp8GivesTheScalarCodesAndSaturationCount) {
  for (const DType to : {DType::kFloat8E4M3, DType::kFloat8E5M2}) {
    std::vector<float> in = float_inputs();
    for (int c = 0; c < 0x7F; ++c) {
      const float v = fp8_to_float(static_cast<uint8_t>(c), to);
      const float next = fp8_to_float(static_cast<uint8_t>(c + 1), to);
      if (!std::isfinite(v)) continue;
      const float mid = std::isfinite(next) ? (v + next) / 2 : v * 1.0625f;  // past the top: saturates
      for (float x : {v, mid, std::nextafter(mid, 0.f), std::nextafter(mid, INFINITY)}) {
        in.push_back(x);
        in.push_back(-x);
      }
    }
    std::vector<uint8_t> got(in.size()), want(in.size());
    int64_t want_saturated = 0;
    for (size_t i = 0; i < in.size(); ++i) {
      const Fp8Encoded e = float_to_fp8(in[i], to);
      want[i] = e.code;
      want_saturated += e.saturated;
    }
    const int64_t n = static_cast<int64_t>(in.size());
    const int64_t saturated = store_scaled(in.data(), DType::kFloat32, 1.f, got.data(), to, n);
    for (size_t i = 0; i < in.size(); ++i) {
      ASSERT_EQ(got[i], want[i]) << dtype_name(to) << " input 0x" << std::hex << bits_of(in[i]) << " on "
                                 << simd_target_name();
    }
    EXPECT_EQ(saturated, want_saturated) << dtype_name(to) << " on " << simd_target_name();
  }
  // Independently of float_to_fp8: e4m3's tie between 1 and 1.125 goes to the
  // even 1 (0x38), 448 is the largest code (0x7E), 464 saturates to it, NaN
  // is S.1111111 and 2^-9 is the smallest subnormal (0x01).
  const float cases[] = {1.0625f, 448.f, 464.f, -464.f, NAN, 0x1p-9f, 0x1p-10f};
  const uint8_t want[] = {0x38, 0x7E, 0x7E, 0xFE, 0x7F, 0x01, 0x00};
  uint8_t out[7];
  EXPECT_EQ(store_scaled(cases, DType::kFloat32, 1.f, out, DType::kFloat8E4M3, 7), 2);
  for (int i = 0; i < 7; ++i) EXPECT_EQ(out[i], want[i]) << "case " << i << " on " << simd_target_name();
}

INSTANTIATE_TEST_SUITE_P(Targets, ConvertSimd, ::testing::Values("best", "avx2"), pagoda::testing::simd_target_name);

}  // namespace
}  // namespace pagoda::cpu
