// The bulk conversions of pagoda/host_convert.h and its non-finite scan.
// fp16 <-> fp32 goes through SIMD with Highway's runtime dispatch (F16C on x86
// when present): the compiler's scalar _Float16 fallback is a library call per
// element, which made appends conversion-bound. bf16 <-> fp32 is the element
// functions' integer rounding on whole vectors: a Decode call's q and output
// (8 sequences x 32 heads x 128, bf16 on the wire) took 34 us each way one
// element at a time, on both the client and the server. The scan of wire
// tensors for NaN and infinity tests a vector of words at a time. fp8, and
// every tail, runs the element functions themselves, so the bits are theirs
// by construction; the SIMD paths give the same bits, which the tests check on
// every target.
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

// The first of n words (no alignment assumed) whose exponent bits are all
// set, or -1: a vector of words tested at once, then the tail word by word.
template <typename Word>
int64_t FirstAllOnes(const std::byte* data, int64_t n, Word exponent) {
  const hn::ScalableTag<Word> d;
  const auto lanes = static_cast<int64_t>(hn::Lanes(d));
  const auto e = hn::Set(d, exponent);
  int64_t i = 0;
  for (; i + lanes <= n; i += lanes) {
    const auto w = hn::LoadU(d, reinterpret_cast<const Word*>(data + i * static_cast<int64_t>(sizeof(Word))));
    const auto hit = hn::Eq(hn::And(w, e), e);
    if (HWY_UNLIKELY(!hn::AllFalse(d, hit))) return i + static_cast<int64_t>(hn::FindFirstTrue(d, hit));
  }
  for (; i < n; ++i) {
    Word w;
    std::memcpy(&w, data + i * static_cast<int64_t>(sizeof(Word)), sizeof(Word));
    if ((w & exponent) == exponent) return i;
  }
  return -1;
}

int64_t FirstNonFinite32(const void* data, int64_t n) {
  return FirstAllOnes<uint32_t>(static_cast<const std::byte*>(data), n, 0x7f800000u);
}
int64_t FirstNonFinite16(const void* data, int64_t n, uint16_t exponent) {
  return FirstAllOnes<uint16_t>(static_cast<const std::byte*>(data), n, exponent);
}

}  // namespace pagoda::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace pagoda {

HWY_EXPORT(Fp16ToFloat);
HWY_EXPORT(FloatToFp16);
HWY_EXPORT(Bf16ToFloat);
HWY_EXPORT(FloatToBf16);
HWY_EXPORT(FirstNonFinite32);
HWY_EXPORT(FirstNonFinite16);

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
    case DType::kFloat32: return HWY_DYNAMIC_DISPATCH(FirstNonFinite32)(data, n);
    case DType::kFloat16: return HWY_DYNAMIC_DISPATCH(FirstNonFinite16)(data, n, uint16_t{0x7c00});
    case DType::kBFloat16: return HWY_DYNAMIC_DISPATCH(FirstNonFinite16)(data, n, uint16_t{0x7f80});
    default: return scalar_first_non_finite(data, dtype, n);
  }
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
      auto* codes = reinterpret_cast<uint8_t*>(out);
      for (int64_t j = 0; j < m; ++j) {
        const Fp8Encoded e = float_to_fp8(tmp[j], to);
        codes[j] = e.code;
        saturated += e.saturated;
      }
    } else {
      convert_from_float(tmp, out, to, m);
    }
  }
  return saturated;
}

}  // namespace pagoda
#endif
