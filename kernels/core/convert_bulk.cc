// The bulk conversions of pagoda/host_convert.h. fp16 <-> fp32 goes through
// SIMD with Highway's runtime dispatch (F16C on x86 when present): the
// compiler's scalar _Float16 fallback is a library call per element, which made
// appends conversion-bound. Every other dtype, and every tail, runs the element
// functions themselves, so the bits are theirs by construction; for fp16 the
// SIMD conversion rounds the same way, which the tests check on every target.
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

}  // namespace pagoda::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace pagoda {

HWY_EXPORT(Fp16ToFloat);
HWY_EXPORT(FloatToFp16);

void convert_to_float(const void* src, DType from, float* dst, int64_t n) {
  if (from == DType::kFloat16) return HWY_DYNAMIC_DISPATCH(Fp16ToFloat)(static_cast<const uint16_t*>(src), dst, n);
  scalar_to_float(src, from, dst, n);
}

void convert_from_float(const float* src, void* dst, DType to, int64_t n) {
  if (to == DType::kFloat16) return HWY_DYNAMIC_DISPATCH(FloatToFp16)(src, static_cast<uint16_t*>(dst), n);
  scalar_from_float(src, dst, to, n);
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
