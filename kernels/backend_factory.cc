// Picks a backend. Without CUDA in the build, asking for it says so plainly.
#include "pagoda/backend_factory.h"

#include "cpu/cpu_backend.h"

#if PAGODA_HAVE_CUDA
#include "cuda/cuda_backend.h"
#endif

namespace pagoda {

BackendMakers built_in_backends() {
  BackendMakers m;
  m.cpu = &make_cpu_backend;
#if PAGODA_HAVE_CUDA
  m.cuda = &cuda::make_backend;
  m.cuda_device_available = &cuda::device_available;
#endif
  return m;
}

StatusOr<std::unique_ptr<Backend>> make_backend_with(const BackendOptions& options, const BackendMakers& makers) {
  std::string kind = options.kind;
  const bool device = makers.cuda != nullptr && makers.cuda_device_available != nullptr && makers.cuda_device_available();
  if (kind == "auto") kind = device ? "cuda" : "cpu";
  if (kind == "cpu") return makers.cpu(options);
  if (kind == "cuda") {
    if (makers.cuda == nullptr) {
      return Status(StatusCode::kFailedPrecondition,
                    "backend: expected one of auto, cpu (this binary was built without CUDA), received 'cuda'");
    }
    return makers.cuda(options);
  }
  return InvalidArgument("backend: expected auto, cpu or cuda, received '{}'", options.kind);
}

StatusOr<std::unique_ptr<Backend>> make_backend(const BackendOptions& options) {
  return make_backend_with(options, built_in_backends());
}

bool cuda_built() { return built_in_backends().cuda != nullptr; }

bool cuda_device_available() {
  const BackendMakers m = built_in_backends();
  return m.cuda_device_available != nullptr && m.cuda_device_available();
}

}  // namespace pagoda
