#pragma once
// The CPU backend: the K/V pools in one aligned host allocation, appends by
// conversion into the cache dtype, and split-KV decode on oneTBB threads.

#include <memory>

#include "pagoda/backend.h"

namespace pagoda {

// Supported head dimensions (CPU and CUDA alike).
inline bool supported_head_dim(int32_t d) { return d == 64 || d == 128 || d == 256; }

// Checks a geometry for the rules every backend relies on; the message names the
// offending field with the expected and received value.
Status validate_geometry(const CacheGeometry& g);

StatusOr<std::unique_ptr<Backend>> make_cpu_backend(const BackendOptions& options);

}  // namespace pagoda
