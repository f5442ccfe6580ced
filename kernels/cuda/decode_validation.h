#pragma once
// Host-side checks of everything a kernel would otherwise trust: a bad request
// becomes a Status naming the field, expected and received value, never an
// out-of-bounds access on the device.

#include "pagoda/backend.h"

namespace pagoda::cuda {

bool is_known_dtype(DType t);

// Geometry the CUDA kernels support: positive sizes, query heads a multiple of
// KV heads, head_dim 64/128/256, a known cache dtype.
Status validate_geometry(const CacheGeometry& g);

// Layer, dtype, scale, split length, and for every sequence a length covered by
// its block table whose used block ids lie inside the pool.
Status validate_decode(const CacheGeometry& g, const DecodeLaunch& launch);

// Layer, dtype, pointers, and every slot inside the pool.
Status validate_kv_write(const CacheGeometry& g, const KvWrite& w);

// Block ids inside the pool.
Status validate_blocks(const CacheGeometry& g, const int32_t* blocks, int32_t count,
                       const char* field);

}  // namespace pagoda::cuda
