// The element conversions (the definitions every other path is held to), and
// the scalar bulk loops and non-finite scan the SIMD dispatch falls back on.
#include "pagoda/host_convert.h"

#include "core/convert_scalar.h"

#include "pagoda/fp8.h"

#include <cmath>
#include <cstring>
#include <vector>

namespace pagoda {

// fp16 by integer rounding, as IEEE 754 binary16 with round-to-nearest-even
// (the x86 F16C conversion's bits, NaN payloads included): no compiler
// _Float16, which not every compiler supports on every target.
float fp16_to_float(uint16_t bits) {
  const uint32_t sign = static_cast<uint32_t>(bits & 0x8000u) << 16;
  const uint32_t exponent = (bits >> 10) & 0x1Fu;
  const uint32_t mantissa = bits & 0x3FFu;
  uint32_t u;
  if (exponent == 0x1F) {
    // Infinity, or NaN with its payload, quieted as the hardware conversion does.
    u = sign | 0x7F800000u | (mantissa << 13) | (mantissa != 0 ? 0x00400000u : 0u);
  } else if (exponent == 0) {
    const float magnitude = static_cast<float>(mantissa) * 0x1p-24f;  // zero or subnormal, exact
    std::memcpy(&u, &magnitude, sizeof u);
    u |= sign;
  } else {
    u = sign | ((exponent + 112) << 23) | (mantissa << 13);
  }
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

uint16_t float_to_fp16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  const auto sign = static_cast<uint16_t>((u >> 16) & 0x8000u);
  const uint32_t a = u & 0x7FFFFFFFu;
  if (a > 0x7F800000u) return static_cast<uint16_t>(sign | 0x7E00u | ((a >> 13) & 0x3FFu));  // quiet NaN
  if (a >= 0x477FF000u) return static_cast<uint16_t>(sign | 0x7C00u);  // >= 65520: rounds to infinity
  if (a < 0x38800000u) {  // below 2^-14: a subnormal (or zero), in units of 2^-24
    float magnitude;
    std::memcpy(&magnitude, &a, sizeof magnitude);
    return static_cast<uint16_t>(sign | static_cast<uint16_t>(std::nearbyint(magnitude * 0x1p24f)));
  }
  uint32_t h = ((((a >> 23) - 112) << 10) | ((a >> 13) & 0x3FFu));
  const uint32_t rest = a & 0x1FFFu;
  if (rest > 0x1000u || (rest == 0x1000u && (h & 1u))) ++h;  // to nearest, ties to even (may carry into the exponent)
  return static_cast<uint16_t>(sign | h);
}

float bf16_to_float(uint16_t bits) {
  const uint32_t u = static_cast<uint32_t>(bits) << 16;
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

uint16_t float_to_bf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40u);  // quiet NaN
  u += 0x7fffu + ((u >> 16) & 1u);  // round to nearest, ties to even
  return static_cast<uint16_t>(u >> 16);
}

void scalar_to_float(const void* src, DType from, float* dst, int64_t n) {
  if (n <= 0) return;  // empty tensors may come with null data (memcpy must not see it)
  const auto* s16 = static_cast<const uint16_t*>(src);
  switch (from) {
    case DType::kFloat32: std::memcpy(dst, src, static_cast<size_t>(n) * 4); return;
    case DType::kFloat16: for (int64_t i = 0; i < n; ++i) dst[i] = fp16_to_float(s16[i]); return;
    case DType::kBFloat16: for (int64_t i = 0; i < n; ++i) dst[i] = bf16_to_float(s16[i]); return;
    case DType::kFloat8E4M3:
    case DType::kFloat8E5M2: {
      const auto* s8 = static_cast<const uint8_t*>(src);
      for (int64_t i = 0; i < n; ++i) dst[i] = fp8_to_float(s8[i], from);
      return;
    }
  }
}

void scalar_from_float(const float* src, void* dst, DType to, int64_t n) {
  if (n <= 0) return;  // empty tensors may come with null data (memcpy must not see it)
  auto* d16 = static_cast<uint16_t*>(dst);
  switch (to) {
    case DType::kFloat32: std::memcpy(dst, src, static_cast<size_t>(n) * 4); return;
    case DType::kFloat16: for (int64_t i = 0; i < n; ++i) d16[i] = float_to_fp16(src[i]); return;
    case DType::kBFloat16: for (int64_t i = 0; i < n; ++i) d16[i] = float_to_bf16(src[i]); return;
    case DType::kFloat8E4M3:
    case DType::kFloat8E5M2: {
      auto* d8 = static_cast<uint8_t*>(dst);
      for (int64_t i = 0; i < n; ++i) d8[i] = float_to_fp8(src[i], to).code;
      return;
    }
  }
}

namespace {

// All exponent bits set: infinity or NaN. Words are read by memcpy (wire
// tensors need not be aligned).
template <typename Word>
int64_t first_with_exponent(const void* data, int64_t n, Word exponent) {
  const auto* bytes = static_cast<const std::byte*>(data);
  for (int64_t i = 0; i < n; ++i) {
    Word w;
    std::memcpy(&w, bytes + i * static_cast<int64_t>(sizeof(Word)), sizeof(Word));
    if ((w & exponent) == exponent) return i;
  }
  return -1;
}

}  // namespace

int64_t scalar_first_non_finite(const void* data, DType dtype, int64_t n) {
  switch (dtype) {
    case DType::kFloat32: return first_with_exponent<uint32_t>(data, n, 0x7f800000u);
    case DType::kFloat16: return first_with_exponent<uint16_t>(data, n, 0x7c00u);
    case DType::kBFloat16: return first_with_exponent<uint16_t>(data, n, 0x7f80u);
    case DType::kFloat8E4M3: {  // no infinities: NaN is S.1111.111
      const auto* b = static_cast<const uint8_t*>(data);
      for (int64_t i = 0; i < n; ++i) {
        if ((b[i] & 0x7F) == 0x7F) return i;
      }
      return -1;
    }
    case DType::kFloat8E5M2: return first_with_exponent<uint8_t>(data, n, 0x7Cu);
  }
  return -1;
}

}  // namespace pagoda
