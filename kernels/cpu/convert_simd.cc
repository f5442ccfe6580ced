// Bulk fp16 <-> fp32 conversions with Highway's runtime dispatch (F16C on x86
// when present). The scalar fallback of the compiler's _Float16 goes through a
// library call per element, which made appends conversion-bound.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "cpu/convert_simd.cc"
#include <hwy/foreach_target.h>  // IWYU pragma: keep

#include <hwy/highway.h>

#include <cstddef>

#include "cpu/convert_simd.h"
#include "pagoda/fp8.h"
#include "pagoda/host_convert.h"

HWY_BEFORE_NAMESPACE();
namespace pagoda::cpu::HWY_NAMESPACE {
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

}  // namespace pagoda::cpu::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace pagoda::cpu {

HWY_EXPORT(Fp16ToFloat);
HWY_EXPORT(FloatToFp16);

void fp16_to_float_n(const uint16_t* src, float* dst, int64_t n) { HWY_DYNAMIC_DISPATCH(Fp16ToFloat)(src, dst, n); }
void float_to_fp16_n(const float* src, uint16_t* dst, int64_t n) { HWY_DYNAMIC_DISPATCH(FloatToFp16)(src, dst, n); }

void to_float(const void* src, DType from, float* dst, int64_t n) {
  if (from == DType::kFloat16) return fp16_to_float_n(static_cast<const uint16_t*>(src), dst, n);
  pagoda::convert_to_float(src, from, dst, n);
}

void from_float(const float* src, void* dst, DType to, int64_t n) {
  if (to == DType::kFloat16) return float_to_fp16_n(src, static_cast<uint16_t*>(dst), n);
  pagoda::convert_from_float(src, dst, to, n);
}

void convert_n(const void* src, DType from, void* dst, DType to, int64_t n) {
  if (from == to || from == DType::kFloat32 || to == DType::kFloat32) {
    if (from == to) return pagoda::convert(src, from, dst, to, n);
    if (from == DType::kFloat32) return from_float(static_cast<const float*>(src), dst, to, n);
    return to_float(src, from, static_cast<float*>(dst), n);
  }
  constexpr int64_t kPiece = 256;
  float tmp[kPiece];
  for (int64_t i = 0; i < n; i += kPiece) {
    const int64_t m = n - i < kPiece ? n - i : kPiece;
    to_float(static_cast<const std::byte*>(src) + i * dtype_size(from), from, tmp, m);
    from_float(tmp, static_cast<std::byte*>(dst) + i * dtype_size(to), to, m);
  }
}

int64_t store_scaled(const void* src, DType from, float scale, void* dst, DType to, int64_t n) {
  constexpr int64_t kPiece = 256;
  float tmp[kPiece];
  int64_t saturated = 0;
  for (int64_t i = 0; i < n; i += kPiece) {
    const int64_t m = n - i < kPiece ? n - i : kPiece;
    to_float(static_cast<const std::byte*>(src) + i * dtype_size(from), from, tmp, m);
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
      from_float(tmp, out, to, m);
    }
  }
  return saturated;
}

}  // namespace pagoda::cpu
#endif
