// Append (vLLM's reshape_and_cache for our layout): scatters new tokens' K/V rows
// into their slots of one layer, divided by the layer's scales and converted
// to the cache dtype on the way.
// Slots were validated on the host; one thread per element, grid-stride.

#include "cuda/device_convert.cuh"
#include "cuda/kernel_params.h"
#include "pagoda/fp8.h"

#include <type_traits>

namespace pagoda::cuda {
namespace {

constexpr int kAppendThreads = 256;
constexpr int kMaxAppendCtas = 4096;

// x / scale into element `at` of a pool of T; fp8 through the shared codec
// (saturating, counted), so both backends store the same bits.
template <typename T>
__device__ __forceinline__ void store_scaled(T* pool, int64_t at, float x, float scale,
                                             unsigned long long* saturated) {
  const float y = x / scale;
  if constexpr (std::is_same_v<T, __nv_fp8_e4m3> || std::is_same_v<T, __nv_fp8_e5m2>) {
    constexpr DType kType =
        std::is_same_v<T, __nv_fp8_e4m3> ? DType::kFloat8E4M3 : DType::kFloat8E5M2;
    const Fp8Encoded e = float_to_fp8(y, kType);
    reinterpret_cast<uint8_t*>(pool)[at] = e.code;
    if (e.saturated && saturated != nullptr) atomicAdd(saturated, 1ull);
  } else {
    pool[at] = from_float<T>(y);
  }
}

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
    store_scaled(k_pool, dst, load_as_float(p.k, p.in_dtype, i), p.k_scale, p.saturated);
    // Latent attention has no V pool (p.v null): V is the prefix of the K row.
    if (p.v != nullptr) store_scaled(v_pool, dst, load_as_float(p.v, p.in_dtype, i), p.v_scale, p.saturated);
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
    case DType::kFloat8E4M3: return launch_typed<__nv_fp8_e4m3>(p, stream);
    case DType::kFloat8E5M2: return launch_typed<__nv_fp8_e5m2>(p, stream);
  }
  return cudaErrorInvalidValue;  // the host validated the dtype; unreachable
}

}  // namespace pagoda::cuda
