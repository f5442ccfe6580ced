#pragma once
// The CPU backend: the K/V pools in one aligned host allocation each, appends by
// conversion into the cache dtype, and split-KV decode on oneTBB threads.

#include <memory>

#include "pagoda/backend.h"

namespace pagoda {

// Validates the geometry (pagoda/geometry_rules.h) and allocates the pools.
StatusOr<std::unique_ptr<Backend>> make_cpu_backend(const BackendOptions& options);

}  // namespace pagoda
