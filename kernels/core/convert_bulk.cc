// The bulk conversions of pagoda/host_convert.h and its non-finite scan.
// fp16 <-> fp32 goes through SIMD with Highway's runtime dispatch (F16C on x86
// when present): the compiler's scalar _Float16 fallback is a library call per
// element, which made appends conversion-bound. bf16 <-> fp32 is the element
// functions' integer rounding on whole vectors: a Decode call's q and output
// (8 sequences x 32 heads x 128, bf16 on the wire) took 34 us each way one
// element at a time, on both the client and the server. The scan of wire
// tensors for NaN and infinity tests a vector of words at a time, and fp32 ->
// fp8 (an fp8 cache's appends: 50 us a step of 8 sequences, one element at a
// time) encodes a vector at a time. fp8 -> fp32, and every tail, runs the
// element functions themselves, so the bits are theirs by construction; the
// SIMD paths give the same bits, which the tests check on every target.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "core/convert_bulk.cc"
#include <hwy/foreach_target.h>  // IWYU pragma: keep

#include <hwy/highway.h>

#include <cstddef>
#include <cstring>

#include "core/convert_scalar.h"
#include "pagoda/fp8.h"
#include "pagoda/host_convert.h"

HWY_BEFORE_NAMESPACE();
namespace pagoda::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

void Fp16ToFloat(const uint16_t* src, float* dst, int64_t n) {
  const hn::ScalableTag<float> df;
  const hn::Rebind<hwy::float16_t, decltype(df)> dh;
  const auto lanes = static_cast<int64_t>(hn::Lanes(df));
  const auto* in = reinterpret_cast<const hwy::float16_t*>(src);
  int64_t i = 0;
  for (; i + lanes <= n; i += lanes) hn::StoreU(hn::PromoteTo(df, hn::LoadU(dh, in + i)), df, dst + i);
  for (; i < n; ++i) dst[i] = fp16_to_float(src[i]);
}

void FloatToFp16(const float* src, uint16_t* dst, int64_t n) {
  const hn::ScalableTag<float> df;
  const hn::Rebind<hwy::float16_t, decltype(df)> dh;
  const auto lanes = static_cast<int64_t>(hn::Lanes(df));
  auto* out = reinterpret_cast<hwy::float16_t*>(dst);
  int64_t i = 0;
  for (; i + lanes <= n; i += lanes) hn::StoreU(hn::DemoteTo(dh, hn::LoadU(df, src + i)), dh, out + i);
  for (; i < n; ++i) dst[i] = float_to_fp16(src[i]);
}

// A bf16 is the top half of an fp32's bits.
void Bf16ToFloat(const uint16_t* src, float* dst, int64_t n) {
  const hn::ScalableTag<float> df;
  const hn::RebindToUnsigned<decltype(df)> du32;
  const hn::Rebind<uint16_t, decltype(df)> du16;
  const auto lanes = static_cast<int64_t>(hn::Lanes(df));
  int64_t i = 0;
  for (; i + lanes <= n; i += lanes) {
    hn::StoreU(hn::BitCast(df, hn::ShiftLeft<16>(hn::PromoteTo(du32, hn::LoadU(du16, src + i)))), df, dst + i);
  }
  for (; i < n; ++i) dst[i] = bf16_to_float(src[i]);
}

// float_to_bf16 lane by lane: NaN keeps its sign and top payload bits and is
// quieted; everything else rounds to nearest, ties to even, by adding 0x7fff
// and the kept half's lowest bit (a carry may reach the exponent: infinity).
void FloatToBf16(const float* src, uint16_t* dst, int64_t n) {
  const hn::ScalableTag<float> df;
  const hn::RebindToUnsigned<decltype(df)> du32;
  const hn::RebindToSigned<decltype(df)> di32;
  const hn::Rebind<uint16_t, decltype(df)> du16;
  const auto lanes = static_cast<int64_t>(hn::Lanes(df));
  const auto magnitude = hn::Set(du32, 0x7fffffffu);
  const auto infinity = hn::Set(di32, 0x7f800000);
  const auto half = hn::Set(du32, 0x7fffu);
  const auto one = hn::Set(du32, 1u);
  const auto quiet = hn::Set(du32, 0x40u);
  int64_t i = 0;
  for (; i + lanes <= n; i += lanes) {
    const auto u = hn::BitCast(du32, hn::LoadU(df, src + i));
    // |x| is non-negative as an int32, so a signed compare finds the NaNs.
    const auto nan = hn::RebindMask(du32, hn::Gt(hn::BitCast(di32, hn::And(u, magnitude)), infinity));
    const auto top = hn::ShiftRight<16>(u);
    const auto rounded = hn::ShiftRight<16>(hn::Add(u, hn::Add(half, hn::And(top, one))));
    // Each result fits 16 bits, so the saturating narrowing keeps it.
    hn::StoreU(hn::DemoteTo(du16, hn::BitCast(di32, hn::IfThenElse(nan, hn::Or(top, quiet), rounded))), du16,
               dst + i);
  }
  for (; i < n; ++i) dst[i] = float_to_bf16(src[i]);
}

// float_to_fp8 lane by lane (pagoda/fp8.h): NaN -> S.1111111, a magnitude
// above the largest finite value -> S and its code (counted), else the
// magnitude over the quantum at its exponent (clamped below the smallest
// normal one: subnormals), a power-of-two scaling and so exact, rounded to
// nearest even by the conversion to int32; a round up into the next binade
// moves to the next exponent. Returns how many saturated.
int64_t FloatToFp8(const float* src, uint8_t* dst, int64_t n, DType format) {
  const Fp8Spec spec = fp8_spec(format);
  const int32_t man_bits = spec.man_bits;
  const int32_t bias = spec.bias;
  const hn::ScalableTag<float> df;
  const hn::RebindToSigned<decltype(df)> di32;
  const hn::Rebind<uint8_t, decltype(df)> du8;
  const auto lanes = static_cast<int64_t>(hn::Lanes(df));
  const int32_t emin = 1 - bias;
  const int32_t implicit = 1 << man_bits;
  const auto v_magnitude = hn::Set(di32, 0x7fffffff);
  const auto v_infinity = hn::Set(di32, 0x7f800000);
  const auto v_max = hn::Set(df, spec.max_value);
  const auto v_emin = hn::Set(di32, emin);
  const auto v_man_plus_bias = hn::Set(di32, man_bits + 127);  // 2^(man_bits - e) as exponent bits
  const auto v_bias = hn::Set(di32, bias);
  const auto v_implicit = hn::Set(di32, implicit);
  const auto v_binade_top = hn::Set(di32, 2 * implicit - 1);  // m past it rounded into the next binade
  const auto v_one = hn::Set(di32, 1);
  const auto v_nan_code = hn::Set(di32, 0x7F);
  const auto v_max_code = hn::Set(di32, static_cast<int32_t>(spec.max_code));
  const auto v_sign_bit = hn::Set(di32, 0x80);
  int64_t saturated = 0;
  int64_t i = 0;
  for (; i + lanes <= n; i += lanes) {
    const auto u = hn::BitCast(di32, hn::LoadU(df, src + i));
    const auto sign = hn::And(hn::ShiftRight<24>(u), v_sign_bit);  // arithmetic shift: bit 7 is the sign either way
    const auto au = hn::And(u, v_magnitude);
    const auto a = hn::BitCast(df, au);
    const auto nan = hn::Gt(au, v_infinity);
    const auto over = hn::RebindMask(di32, hn::Gt(a, v_max));  // false for NaN
    const auto e = hn::Max(hn::Sub(hn::ShiftRight<23>(au), hn::Set(di32, 127)), v_emin);
    const auto quantum_inverse = hn::BitCast(df, hn::ShiftLeft<23>(hn::Sub(v_man_plus_bias, e)));
    auto m = hn::NearestInt(hn::Mul(a, quantum_inverse));
    auto e_field = hn::Add(e, v_bias);
    const auto carried = hn::Gt(m, v_binade_top);
    m = hn::IfThenElse(carried, hn::ShiftRight<1>(m), m);
    e_field = hn::IfThenElse(carried, hn::Add(e_field, v_one), e_field);
    const auto normal = hn::Or(hn::ShiftLeftSame(e_field, man_bits), hn::Sub(m, v_implicit));
    auto code = hn::IfThenElse(hn::Lt(m, v_implicit), m, normal);
    code = hn::IfThenElse(over, v_max_code, code);
    code = hn::IfThenElse(nan, v_nan_code, code);
    hn::StoreU(hn::DemoteTo(du8, hn::Or(code, sign)), du8, dst + i);
    saturated += static_cast<int64_t>(hn::CountTrue(di32, over));
  }
  for (; i < n; ++i) {
    const Fp8Encoded e = float_to_fp8(src[i], format);
    dst[i] = e.code;
    saturated += e.saturated;
  }
  return saturated;
}

// The first of n words (no alignment assumed) whose exponent bits are all
// set, or -1: a vector of words tested at once, the tail by the scalar scan.
template <typename Word>
int64_t FirstAllOnes(const std::byte* data, int64_t n, Word exponent, DType dtype) {
  const hn::ScalableTag<Word> d;
  const auto lanes = static_cast<int64_t>(hn::Lanes(d));
  const auto e = hn::Set(d, exponent);
  int64_t i = 0;
  for (; i + lanes <= n; i += lanes) {
    const auto w = hn::LoadU(d, reinterpret_cast<const Word*>(data + i * static_cast<int64_t>(sizeof(Word))));
    const auto hit = hn::Eq(hn::And(w, e), e);
    if (HWY_UNLIKELY(!hn::AllFalse(d, hit))) return i + static_cast<int64_t>(hn::FindFirstTrue(d, hit));
  }
  if (i == n) return -1;
  const int64_t tail = scalar_first_non_finite(data + i * static_cast<int64_t>(sizeof(Word)), dtype, n - i);
  return tail < 0 ? -1 : i + tail;
}

// fp32, fp16, bf16 and e5m2: infinity and NaN are the words with every
// exponent bit set; e4m3 has no infinity and one NaN code per sign, every bit
// but the sign set.
int64_t FirstNonFinite(const void* data, int64_t n, DType dtype) {
  const auto* bytes = static_cast<const std::byte*>(data);
  if (dtype == DType::kFloat32) return FirstAllOnes<uint32_t>(bytes, n, 0x7f800000u, dtype);
  if (dtype == DType::kFloat8E4M3) return FirstAllOnes<uint8_t>(bytes, n, uint8_t{0x7f}, dtype);
  if (dtype == DType::kFloat8E5M2) return FirstAllOnes<uint8_t>(bytes, n, uint8_t{0x7c}, dtype);
  return FirstAllOnes<uint16_t>(bytes, n, dtype == DType::kFloat16 ? uint16_t{0x7c00} : uint16_t{0x7f80}, dtype);
}

}  // namespace pagoda::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace pagoda {

HWY_EXPORT(Fp16ToFloat);
HWY_EXPORT(FloatToFp16);
HWY_EXPORT(Bf16ToFloat);
HWY_EXPORT(FloatToBf16);
HWY_EXPORT(FirstNonFinite);
HWY_EXPORT(FloatToFp8);

void convert_to_float(const void* src, DType from, float* dst, int64_t n) {
  if (from == DType::kFloat16) return HWY_DYNAMIC_DISPATCH(Fp16ToFloat)(static_cast<const uint16_t*>(src), dst, n);
  if (from == DType::kBFloat16) return HWY_DYNAMIC_DISPATCH(Bf16ToFloat)(static_cast<const uint16_t*>(src), dst, n);
  scalar_to_float(src, from, dst, n);
}

void convert_from_float(const float* src, void* dst, DType to, int64_t n) {
  if (to == DType::kFloat16) return HWY_DYNAMIC_DISPATCH(FloatToFp16)(src, static_cast<uint16_t*>(dst), n);
  if (to == DType::kBFloat16) return HWY_DYNAMIC_DISPATCH(FloatToBf16)(src, static_cast<uint16_t*>(dst), n);
  scalar_from_float(src, dst, to, n);
}

int64_t first_non_finite(const void* data, DType dtype, int64_t n) {
  if (n <= 0) return -1;  // empty tensors may come with null data
  switch (dtype) {
    case DType::kFloat32:
    case DType::kFloat16:
    case DType::kBFloat16:
    case DType::kFloat8E4M3:
    case DType::kFloat8E5M2: return HWY_DYNAMIC_DISPATCH(FirstNonFinite)(data, n, dtype);
  }
  return scalar_first_non_finite(data, dtype, n);
}

namespace {

// Elements per step through a stack buffer of fp32 where neither side is fp32.
constexpr int64_t kPiece = 256;

}  // namespace

void convert(const void* src, DType from, void* dst, DType to, int64_t n) {
  if (n <= 0) return;  // empty tensors may come with null data
  if (from == to) {
    std::memcpy(dst, src, static_cast<size_t>(n) * dtype_size(from));
    return;
  }
  if (from == DType::kFloat32) return convert_from_float(static_cast<const float*>(src), dst, to, n);
  if (to == DType::kFloat32) return convert_to_float(src, from, static_cast<float*>(dst), n);
  float tmp[kPiece];
  for (int64_t i = 0; i < n; i += kPiece) {
    const int64_t m = n - i < kPiece ? n - i : kPiece;
    convert_to_float(static_cast<const std::byte*>(src) + i * dtype_size(from), from, tmp, m);
    convert_from_float(tmp, static_cast<std::byte*>(dst) + i * dtype_size(to), to, m);
  }
}

int64_t store_scaled(const void* src, DType from, float scale, void* dst, DType to, int64_t n) {
  if (scale == 1.f && !is_fp8(to)) {
    convert(src, from, dst, to, n);
    return 0;
  }
  float tmp[kPiece];
  int64_t saturated = 0;
  for (int64_t i = 0; i < n; i += kPiece) {
    const int64_t m = n - i < kPiece ? n - i : kPiece;
    convert_to_float(static_cast<const std::byte*>(src) + i * dtype_size(from), from, tmp, m);
    if (scale != 1.f) {
      for (int64_t j = 0; j < m; ++j) tmp[j] /= scale;
    }
    std::byte* out = static_cast<std::byte*>(dst) + i * dtype_size(to);
    if (is_fp8(to)) {
      saturated += HWY_DYNAMIC_DISPATCH(FloatToFp8)(tmp, reinterpret_cast<uint8_t*>(out), m, to);
    } else {
      convert_from_float(tmp, out, to, m);
    }
  }
  return saturated;
}

}  // namespace pagoda
#endif
