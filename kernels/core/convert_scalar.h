#pragma once
// The element functions of pagoda/host_convert.h in plain loops: what the bulk
// conversions use for the dtypes and tails SIMD does not speed up.

#include <cstdint>

#include "pagoda/dtype.h"

namespace pagoda {

void scalar_to_float(const void* src, DType from, float* dst, int64_t n);
void scalar_from_float(const float* src, void* dst, DType to, int64_t n);

}  // namespace pagoda
