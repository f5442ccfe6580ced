#pragma once
// Host conversions between fp32 and the 16-bit and 8-bit cache/tensor types,
// rounding to nearest even (fp16 and bf16 by integer rounding, fp8 as
// pagoda/fp8.h: saturating); NaN stays NaN.

#include <cstdint>

#include "pagoda/dtype.h"

namespace pagoda {

float fp16_to_float(uint16_t bits);
uint16_t float_to_fp16(float f);
float bf16_to_float(uint16_t bits);
uint16_t float_to_bf16(float f);

// dst[i] = src[i] converted from `from` to fp32. n elements.
void convert_to_float(const void* src, DType from, float* dst, int64_t n);
// dst[i] = src[i] converted from fp32 to `to`.
void convert_from_float(const float* src, void* dst, DType to, int64_t n);
// Any dtype to any dtype (through fp32 where the types differ).
void convert(const void* src, DType from, void* dst, DType to, int64_t n);

// Index of the first NaN or infinity among n elements of `dtype`, or -1.
int64_t first_non_finite(const void* data, DType dtype, int64_t n);

}  // namespace pagoda
