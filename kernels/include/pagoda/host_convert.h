#pragma once
// The host's one conversion module between fp32 and the 16-bit and 8-bit
// cache/tensor types, rounding to nearest even (fp16 and bf16 by integer
// rounding, fp8 as pagoda/fp8.h: saturating); NaN stays NaN.
//
// Two layers, one set of bits: the element functions below are the definitions
// (kernels/core/host_convert.cc); the bulk functions run them through SIMD with
// Highway's runtime dispatch where that is faster (kernels/core/convert_bulk.cc),
// and tests/unit/convert_simd_test.cc holds the two equal bit for bit on every
// target. The device has its own (kernels/cuda/device_convert.cuh, the hardware's
// conversions), held to these by the CUDA tests; the CPU kernel widens cache
// elements in registers (kernels/cpu/decode_reads_inl.h, load_f32), held to these by
// the decode tests.

#include <cstdint>

#include "pagoda/dtype.h"

namespace pagoda {

// Elements.
float fp16_to_float(uint16_t bits);
uint16_t float_to_fp16(float f);
float bf16_to_float(uint16_t bits);
uint16_t float_to_bf16(float f);
// fp8: fp8_to_float and float_to_fp8 in pagoda/fp8.h (shared with the device).

// Bulk, n elements each. dst[i] = src[i] converted from `from` to fp32.
void convert_to_float(const void* src, DType from, float* dst, int64_t n);
// dst[i] = src[i] converted from fp32 to `to`.
void convert_from_float(const float* src, void* dst, DType to, int64_t n);
// Any dtype to any dtype (through fp32 where the types differ).
void convert(const void* src, DType from, void* dst, DType to, int64_t n);
// dst = src / scale in the cache dtype `to` (fp8: saturating). Returns how
// many elements saturated.
int64_t store_scaled(const void* src, DType from, float scale, void* dst, DType to, int64_t n);

// Index of the first NaN or infinity among n elements of `dtype`, or -1
// (a vector of words at a time; for e4m3, its NaN code).
int64_t first_non_finite(const void* data, DType dtype, int64_t n);

}  // namespace pagoda
