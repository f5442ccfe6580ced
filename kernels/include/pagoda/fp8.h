#pragma once
// The OCP FP8 formats of the fp8 cache (docs/design.md §9), one definition for the
// host, the CPU backend's appends and the CUDA software path:
//   e4m3: S EEEE MMM, bias 7, no infinities, NaN = S.1111.111, max 448
//   e5m2: S EEEEE MM, bias 15, IEEE-like (inf = S.11111.00), max finite 57344
// Encoding rounds to nearest, ties to even, and saturates: a magnitude above
// the largest finite value (an infinity included) becomes that value, and is
// reported as saturated. NaN stays NaN.

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>

#include "pagoda/dtype.h"
#include "pagoda/hd.h"

namespace pagoda {

struct Fp8Spec {
  int man_bits;
  int bias;
  uint8_t max_code;  // the largest finite magnitude's code
  float max_value;
};

HD Fp8Spec fp8_spec(DType t) {
  return t == DType::kFloat8E4M3 ? Fp8Spec{3, 7, 0x7E, 448.f} : Fp8Spec{2, 15, 0x7B, 57344.f};
}

// 2^e for a normal exponent (-126 <= e <= 127), from its bits: exact, and no
// library call on the append path.
HD float pow2(int e) {
  const uint32_t u = static_cast<uint32_t>(e + 127) << 23;
  float f;
  memcpy(&f, &u, sizeof f);
  return f;
}

HD float fp8_to_float(uint8_t code, DType t) {
  const Fp8Spec s = fp8_spec(t);
  const int exp_bits = 7 - s.man_bits;
  const int e = (code >> s.man_bits) & ((1 << exp_bits) - 1);
  const int m = code & ((1 << s.man_bits) - 1);
  const float sign = (code & 0x80) ? -1.f : 1.f;
  const int e_top = (1 << exp_bits) - 1;
  if (t == DType::kFloat8E4M3 && e == e_top && m == 7) return std::numeric_limits<float>::quiet_NaN();
  if (t == DType::kFloat8E5M2 && e == e_top) {
    return m == 0 ? sign * std::numeric_limits<float>::infinity() : std::numeric_limits<float>::quiet_NaN();
  }
  if (e == 0) return sign * static_cast<float>(m) * pow2(1 - s.bias - s.man_bits);
  return sign * static_cast<float>((1 << s.man_bits) + m) * pow2(e - s.bias - s.man_bits);
}

struct Fp8Encoded {
  uint8_t code;
  bool saturated;  // |x| was above the largest finite value
};

HD Fp8Encoded float_to_fp8(float x, DType t) {
  const Fp8Spec s = fp8_spec(t);
  uint32_t u;
  memcpy(&u, &x, sizeof u);
  const auto sign = static_cast<uint8_t>((u >> 24) & 0x80u);
  u &= 0x7fffffffu;
  if (u > 0x7f800000u) return {static_cast<uint8_t>(sign | 0x7F), false};  // NaN in both formats
  float a;
  memcpy(&a, &u, sizeof a);
  if (a > s.max_value) return {static_cast<uint8_t>(sign | s.max_code), true};
  // a over the quantum at its exponent (fixed below the smallest normal
  // exponent: subnormals) is exact, a power-of-two scaling; rintf rounds it to
  // nearest even.
  const int emin = 1 - s.bias;
  int e = static_cast<int>(u >> 23) - 127;
  if (e < emin) e = emin;
  int m = static_cast<int>(rintf(a * pow2(s.man_bits - e)));
  int e_field = e + s.bias;
  if (m >= (2 << s.man_bits)) {  // rounded up into the next binade
    m >>= 1;
    ++e_field;
  }
  const int implicit = 1 << s.man_bits;
  const int code = m < implicit ? m : (e_field << s.man_bits) | (m - implicit);
  return {static_cast<uint8_t>(sign | code), false};
}

}  // namespace pagoda
