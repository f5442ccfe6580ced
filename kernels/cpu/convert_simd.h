#pragma once
// Bulk fp16 <-> fp32 conversion, SIMD with runtime dispatch. Rounds to nearest
// even, as the scalar conversions in pagoda/host_convert.h do.

#include <cstdint>

namespace pagoda::cpu {

void fp16_to_float_n(const uint16_t* src, float* dst, int64_t n);  // [n] -> [n]
void float_to_fp16_n(const float* src, uint16_t* dst, int64_t n);  // [n] -> [n]

}  // namespace pagoda::cpu
