#pragma once
// Which caches "best" gives the AVX512-BF16 dot products where there is no
// AMX (simd_target.cc): from a group of query heads per KV head that depends
// on the cache's dtype and head_dim and on the CPU family it was measured on.

#include <cstdint>

#include "cpu/cpu_family.h"
#include "pagoda/dtype.h"

namespace pagoda::cpu {

// The smallest group whose bf16 or fp8 cache takes the dot products under "best".
int32_t dot_min_group(DType dtype, int32_t head_dim, CpuFamily cpu);

}  // namespace pagoda::cpu
