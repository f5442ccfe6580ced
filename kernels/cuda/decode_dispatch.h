#pragma once
// The one flat dispatch of the partial kernel over (cache dtype, head_dim): the
// tables of instances (one per head dim and cache dtype of the vocabulary,
// pagoda/vocabulary.h); anything else is an InvalidArgument Status.

#include "cuda/kernel_params.h"
#include "pagoda/status.h"

namespace pagoda::cuda {

StatusOr<const PartialKernel*> find_partial_kernel(DType cache_dtype, int32_t head_dim);

}  // namespace pagoda::cuda
