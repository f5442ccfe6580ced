// Append (vLLM's reshape_and_cache for our layout): scatters new tokens' K/V rows
// into their slots of one layer, converting to the cache dtype on the way.
// Slots were validated on the host; one thread per element, grid-stride.

#include "cuda/device_convert.cuh"
#include "cuda/kernel_params.h"

namespace pagoda::cuda {
namespace {

constexpr int kAppendThreads = 256;
constexpr int kMaxAppendCtas = 4096;

template <typename T>
__global__ void __launch_bounds__(kAppendThreads) append_kernel(const AppendParams p) {
  const CacheGeometry g = p.geometry;
  const int64_t per_token = static_cast<int64_t>(g.num_kv_heads) * g.head_dim;
  const int64_t total = per_token * p.num_tokens;
  T* k_pool = static_cast<T*>(p.k_pool);
  T* v_pool = static_cast<T*>(p.v_pool);
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < total;
       i += stride) {
    const int64_t token = i / per_token;
    const int64_t in_token = i % per_token;
    const int32_t kv_head = static_cast<int32_t>(in_token / g.head_dim);
    const int32_t elem = static_cast<int32_t>(in_token % g.head_dim);
    const int64_t slot = p.slots[token];
    const int64_t dst = g.element_offset(p.layer, static_cast<int32_t>(slot / g.block_size),
                                         kv_head, static_cast<int32_t>(slot % g.block_size)) +
                        elem;
    k_pool[dst] = from_float<T>(load_as_float(p.k, p.in_dtype, i));
    v_pool[dst] = from_float<T>(load_as_float(p.v, p.in_dtype, i));
  }
}

template <typename T>
cudaError_t launch_typed(const AppendParams& p, cudaStream_t stream) {
  const int64_t total =
      static_cast<int64_t>(p.num_tokens) * p.geometry.num_kv_heads * p.geometry.head_dim;
  const int64_t wanted = (total + kAppendThreads - 1) / kAppendThreads;
  const unsigned ctas = static_cast<unsigned>(wanted < kMaxAppendCtas ? wanted : kMaxAppendCtas);
  append_kernel<T><<<ctas, kAppendThreads, 0, stream>>>(p);
  return cudaGetLastError();
}

}  // namespace

cudaError_t launch_append(const AppendParams& p, cudaStream_t stream) {
  if (p.num_tokens == 0) return cudaSuccess;
  switch (p.geometry.dtype) {
    case DType::kFloat16: return launch_typed<__half>(p, stream);
    case DType::kBFloat16: return launch_typed<__nv_bfloat16>(p, stream);
    case DType::kFloat32: return launch_typed<float>(p, stream);
  }
  return cudaErrorInvalidValue;  // the host validated the dtype; unreachable
}

}  // namespace pagoda::cuda
