#pragma once
// CUDA errors as Status values with the call site: one macro for every runtime
// call of the host code. Never aborts; a sticky error (illegal address) keeps
// failing every later call with its own Status.

#include <cuda_runtime_api.h>

#include "pagoda/status.h"

namespace pagoda::cuda {

// "cuda: <call> failed at <file>:<line>: <error name> (<description>)".
// Out of memory maps to RESOURCE_EXHAUSTED, anything else to INTERNAL.
Status cuda_error_status(cudaError_t err, const char* call, const char* file, int line);

}  // namespace pagoda::cuda

#define PAGODA_CUDA_RETURN_IF_ERROR(call)                                                  \
  do {                                                                                     \
    const cudaError_t pagoda_cuda_err_ = (call);                                           \
    if (pagoda_cuda_err_ != cudaSuccess)                                                   \
      return ::pagoda::cuda::cuda_error_status(pagoda_cuda_err_, #call, __FILE__, __LINE__); \
  } while (0)
