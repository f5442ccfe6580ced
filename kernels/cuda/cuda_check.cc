#include "cuda/cuda_check.h"

namespace pagoda::cuda {

Status cuda_error_status(cudaError_t err, const char* call, const char* file, int line) {
  // Clears the runtime's last-error slot so that a later, unrelated check does
  // not report this failure a second time (sticky errors stay regardless).
  (void)cudaGetLastError();
  const StatusCode code =
      err == cudaErrorMemoryAllocation ? StatusCode::kResourceExhausted : StatusCode::kInternal;
  return {code, fmt::format("cuda: {} failed at {}:{}: {} ({})", call, file, line,
                            cudaGetErrorName(err), cudaGetErrorString(err))};
}

}  // namespace pagoda::cuda
