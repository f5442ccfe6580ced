#pragma once
// The CUDA backend's entry points, as the backend factory sees them. No CUDA
// header here: the factory is compiled by the host compiler alone.

#include <memory>

#include "pagoda/backend.h"
#include "pagoda/status.h"

namespace pagoda::cuda {

// True when the CUDA runtime answers and reports at least one device. Any error
// (no driver, cudaErrorInsufficientDriver on a machine with only the stub
// libcuda, no device) means "no device".
bool device_available();

// Validates the geometry first (so a bad shape is InvalidArgument even without
// a GPU), then opens options.cuda_device and allocates the pools and workspaces.
StatusOr<std::unique_ptr<Backend>> make_backend(const BackendOptions& options);

}  // namespace pagoda::cuda
