#include "cuda/decode_dispatch.h"

#include <array>

#include "pagoda/vocabulary.h"

namespace pagoda::cuda {

StatusOr<const PartialKernel*> find_partial_kernel(DType cache_dtype, int32_t head_dim) {
  const std::array<std::span<const PartialKernel>, 4> tables = {
      partial_kernels_fp16(), partial_kernels_bf16(), partial_kernels_fp32(), partial_kernels_fp8()};
  for (const auto& table : tables) {
    for (const PartialKernel& k : table) {
      if (k.cache_dtype == cache_dtype && k.head_dim == head_dim) return &k;
    }
  }
  return InvalidArgument("head_dim x cache dtype: expected head_dim {} with {}, received head_dim {} with dtype {}",
                         head_dim_list(), cache_dtype_list(), head_dim, dtype_name(cache_dtype));
}

}  // namespace pagoda::cuda
