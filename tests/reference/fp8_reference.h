#pragma once
// An fp8 reference written apart from pagoda/fp8.h: values from the format's
// definition in double, and encoding by search over every code (the nearest
// finite value; ties to the code with an even mantissa; magnitudes above the
// largest finite value to it). Slow and obviously right.

#include <cstdint>

#include "pagoda/dtype.h"

namespace pagoda::testing {

// The value of `code` (NaN for the NaN codes, +-inf for e5m2's infinities).
double reference_fp8_value(uint8_t code, DType format);

// The code the rounding rule picks for x; NaN gives sign | 0x7F.
uint8_t reference_fp8_encode(double x, DType format);

// The largest finite value: 448 (e4m3), 57344 (e5m2).
double reference_fp8_max(DType format);

}  // namespace pagoda::testing
