#pragma once
// The seam of make_backend: which backends this binary can make. make_backend
// uses the built-in set; tests pass their own (e.g. a set without CUDA) so that
// every branch of the choice runs in every build.

#include <memory>

#include "pagoda/backend.h"

namespace pagoda {

struct BackendMakers {
  StatusOr<std::unique_ptr<Backend>> (*cpu)(const BackendOptions&) = nullptr;
  // Null: this binary was built without CUDA.
  StatusOr<std::unique_ptr<Backend>> (*cuda)(const BackendOptions&) = nullptr;
  // Whether a CUDA device answers; null when cuda is null.
  bool (*cuda_device_available)() = nullptr;
};

// The backends compiled into this binary.
BackendMakers built_in_backends();

// make_backend over an explicit set: "auto" is CUDA when it is present and a
// device answers, the CPU otherwise; "cuda" without CUDA is FAILED_PRECONDITION
// saying so; an unknown kind is INVALID_ARGUMENT.
StatusOr<std::unique_ptr<Backend>> make_backend_with(const BackendOptions& options, const BackendMakers& makers);

}  // namespace pagoda
