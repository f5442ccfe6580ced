#pragma once
// Bulk conversions for the CPU backend's hot paths (appends, q in, outputs out).
// fp16 goes through SIMD with runtime dispatch (F16C on x86 when present); the
// compiler's scalar _Float16 goes through a library call per element, which made
// appends conversion-bound. Rounding is to nearest even, exactly as the scalar
// conversions of pagoda/host_convert.h (tests check the two bit for bit).

#include <cstdint>

#include "pagoda/dtype.h"

namespace pagoda::cpu {

void fp16_to_float_n(const uint16_t* src, float* dst, int64_t n);  // [n] -> [n]
void float_to_fp16_n(const float* src, uint16_t* dst, int64_t n);  // [n] -> [n]

// As pagoda::convert_to_float / convert_from_float / convert (the scalar
// definitions, pagoda/host_convert.h), in bulk, with the same bits.
void to_float(const void* src, DType from, float* dst, int64_t n);
void from_float(const float* src, void* dst, DType to, int64_t n);
// Any dtype to any dtype; through a small stack buffer of fp32 where both differ from fp32.
void convert_n(const void* src, DType from, void* dst, DType to, int64_t n);

// dst = src / scale in the cache dtype `to` (fp8: saturating, pagoda/fp8.h).
// Returns how many elements saturated.
int64_t store_scaled(const void* src, DType from, float scale, void* dst, DType to, int64_t n);

}  // namespace pagoda::cpu
