#pragma once
// The element functions of pagoda/host_convert.h in plain loops: what the bulk
// conversions and the non-finite scan use for the dtypes SIMD does not speed up.

#include <cstdint>

#include "pagoda/dtype.h"

namespace pagoda {

void scalar_to_float(const void* src, DType from, float* dst, int64_t n);
void scalar_from_float(const float* src, void* dst, DType to, int64_t n);
// first_non_finite word by word: the definition, and the fp8 formats' scan.
int64_t scalar_first_non_finite(const void* data, DType dtype, int64_t n);

}  // namespace pagoda
