#pragma once
// K/V values a 16-bit cache cannot hold. fp16 (largest finite 65504) and bf16
// (about 3.39e38) would store a finite value past their range as +-inf, and every
// later Decode of that sequence would return inf or NaN: such values are refused
// like non-finite ones (docs/design.md §11). fp32 holds every finite input; fp8 caches
// saturate by design and count it (docs/metrics.md).

#include <cstdint>

#include "pagoda/backend.h"
#include "pagoda/status.h"

namespace pagoda {

// INVALID_ARGUMENT naming the first element of `k` or `v` (each rows x
// num_kv_heads x head_dim values of dtype `wire`, already known finite) whose
// stored value (x / the layer's scale) is outside the cache dtype's range, with
// its row, head and element, the value and the range. Nothing is changed.
// v is null when V is K's prefix (latent attention).
Status check_cache_range(const void* k, const void* v, DType wire, int64_t rows, const CacheGeometry& g,
                         KvScale scale);

}  // namespace pagoda
