#pragma once
// The values of a request's K/V, checked in one pass over each tensor's bytes
// where they lie (the message or a shared-memory region): every element must
// be finite, since one NaN in a cache poisons every later step of its sequence
// (docs/design.md §11), and, for a 16-bit cache, within its range: fp16
// (largest finite 65504) and bf16 (about 3.39e38) would store a finite value
// past it as +-inf, so such values are refused like non-finite ones. fp32
// holds every finite input; fp8 caches saturate by design and count it
// (docs/metrics.md).

#include <cstdint>

#include "pagoda/backend.h"
#include "pagoda/status.h"

namespace pagoda {

// INVALID_ARGUMENT naming the first element of `k`, then of `v` (each rows x
// num_kv_heads x head_dim values of dtype `wire`), that is not finite or whose
// stored value (x / the layer's scale) is outside the cache dtype's range,
// with its row, head and element, the value (and the range). Nothing is
// changed. v is null when V is K's prefix (latent attention).
Status check_kv_values(const void* k, const void* v, DType wire, int64_t rows, const CacheGeometry& g, KvScale scale);

}  // namespace pagoda
