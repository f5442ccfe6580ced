// Picks a backend. Without CUDA in the build, asking for it says so plainly.
#include <memory>

#include "cpu/cpu_backend.h"
#include "pagoda/backend.h"

#if PAGODA_HAVE_CUDA
#include "cuda/cuda_backend.h"
#endif

namespace pagoda {

bool cuda_built() {
#if PAGODA_HAVE_CUDA
  return true;
#else
  return false;
#endif
}

bool cuda_device_available() {
#if PAGODA_HAVE_CUDA
  return cuda::device_available();
#else
  return false;
#endif
}

StatusOr<std::unique_ptr<Backend>> make_backend(const BackendOptions& options) {
  std::string kind = options.kind;
  if (kind == "auto") kind = cuda_device_available() ? "cuda" : "cpu";
  if (kind == "cpu") return make_cpu_backend(options);
  if (kind == "cuda") {
#if PAGODA_HAVE_CUDA
    return cuda::make_backend(options);
#else
    return Status(StatusCode::kFailedPrecondition,
                  "backend: expected one of auto, cpu (this binary was built without CUDA), "
                  "received 'cuda'");
#endif
  }
  return InvalidArgument("backend: expected auto, cpu or cuda, received '{}'", options.kind);
}

}  // namespace pagoda
