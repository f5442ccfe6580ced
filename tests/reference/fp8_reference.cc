#include "reference/fp8_reference.h"

#include <cmath>
#include <limits>

namespace pagoda::testing {

double reference_fp8_value(uint8_t code, DType format) {
  const bool e4m3 = format == DType::kFloat8E4M3;
  const int mantissa_bits = e4m3 ? 3 : 2;
  const int exponent_bits = e4m3 ? 4 : 5;
  const int bias = e4m3 ? 7 : 15;
  const double sign = (code >> 7) ? -1.0 : 1.0;
  const int exponent = (code >> mantissa_bits) & ((1 << exponent_bits) - 1);
  const int mantissa = code & ((1 << mantissa_bits) - 1);
  const double fraction = mantissa / static_cast<double>(1 << mantissa_bits);
  const int top = (1 << exponent_bits) - 1;
  if (e4m3 && exponent == top && mantissa == 7) return std::numeric_limits<double>::quiet_NaN();
  if (!e4m3 && exponent == top) {
    return mantissa == 0 ? sign * std::numeric_limits<double>::infinity() : std::numeric_limits<double>::quiet_NaN();
  }
  if (exponent == 0) return sign * fraction * std::pow(2.0, 1 - bias);
  return sign * (1.0 + fraction) * std::pow(2.0, exponent - bias);
}

double reference_fp8_max(DType format) { return format == DType::kFloat8E4M3 ? 448.0 : 57344.0; }

uint8_t reference_fp8_encode(double x, DType format) {
  const uint8_t sign = std::signbit(x) ? 0x80 : 0x00;
  if (std::isnan(x)) return static_cast<uint8_t>(sign | 0x7F);
  const double a = std::min(std::abs(x), reference_fp8_max(format));
  int best = -1;
  double best_error = 0;
  for (int c = 0; c < 0x80; ++c) {
    const double v = reference_fp8_value(static_cast<uint8_t>(c), format);
    if (!std::isfinite(v)) continue;
    const double error = std::abs(v - a);
    const bool better = best < 0 || error < best_error || (error == best_error && (c & 1) == 0);
    if (better) {
      best = c;
      best_error = error;
    }
  }
  return static_cast<uint8_t>(sign | best);
}

}  // namespace pagoda::testing
