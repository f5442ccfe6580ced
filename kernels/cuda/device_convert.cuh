#pragma once
// Element conversions on the device. Narrowing goes through fp32 and rounds to
// nearest even (one rounding: fp16 and bf16 widen to fp32 exactly).

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include "pagoda/dtype.h"

namespace pagoda::cuda {

// The C++ type of each cache dtype.
template <DType D> struct CacheType;
template <> struct CacheType<DType::kFloat32> { using type = float; };
template <> struct CacheType<DType::kFloat16> { using type = __half; };
template <> struct CacheType<DType::kBFloat16> { using type = __nv_bfloat16; };
template <> struct CacheType<DType::kFloat8E4M3> { using type = __nv_fp8_e4m3; };
template <> struct CacheType<DType::kFloat8E5M2> { using type = __nv_fp8_e5m2; };

__device__ __forceinline__ float to_float(float x) { return x; }
__device__ __forceinline__ float to_float(__half x) { return __half2float(x); }
__device__ __forceinline__ float to_float(__nv_bfloat16 x) { return __bfloat162float(x); }

template <typename T> __device__ __forceinline__ T from_float(float x);
template <> __device__ __forceinline__ float from_float<float>(float x) { return x; }
template <> __device__ __forceinline__ __half from_float<__half>(float x) { return __float2half_rn(x); }
template <> __device__ __forceinline__ __nv_bfloat16 from_float<__nv_bfloat16>(float x) {
  return __float2bfloat16_rn(x);
}

// Element i of a buffer whose dtype is known only at run time (q, append inputs:
// read once per element, so the switch costs nothing that matters).
__device__ __forceinline__ float load_as_float(const void* base, DType t, int64_t i) {
  switch (t) {
    case DType::kFloat16: return to_float(static_cast<const __half*>(base)[i]);
    case DType::kBFloat16: return to_float(static_cast<const __nv_bfloat16*>(base)[i]);
    default: return static_cast<const float*>(base)[i];
  }
}

__device__ __forceinline__ void store_from_float(void* base, DType t, int64_t i, float x) {
  switch (t) {
    case DType::kFloat16: static_cast<__half*>(base)[i] = from_float<__half>(x); break;
    case DType::kBFloat16:
      static_cast<__nv_bfloat16*>(base)[i] = from_float<__nv_bfloat16>(x);
      break;
    default: static_cast<float*>(base)[i] = x; break;
  }
}

// Eight consecutive elements of a 16-byte aligned row, widened to fp32: one
// 16-byte shared-memory load for 16-bit types, two for fp32.
__device__ __forceinline__ void widen8(const float* src, float (&dst)[8]) {
  const float4 a = reinterpret_cast<const float4*>(src)[0];
  const float4 b = reinterpret_cast<const float4*>(src)[1];
  dst[0] = a.x; dst[1] = a.y; dst[2] = a.z; dst[3] = a.w;
  dst[4] = b.x; dst[5] = b.y; dst[6] = b.z; dst[7] = b.w;
}

__device__ __forceinline__ void widen8(const __half* src, float (&dst)[8]) {
  const uint4 raw = *reinterpret_cast<const uint4*>(src);
  const __half2* h = reinterpret_cast<const __half2*>(&raw);
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const float2 f = __half22float2(h[i]);
    dst[2 * i] = f.x;
    dst[2 * i + 1] = f.y;
  }
}

__device__ __forceinline__ void widen8(const __nv_bfloat16* src, float (&dst)[8]) {
  const uint4 raw = *reinterpret_cast<const uint4*>(src);
  const __nv_bfloat162* h = reinterpret_cast<const __nv_bfloat162*>(&raw);
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const float2 f = __bfloat1622float2(h[i]);
    dst[2 * i] = f.x;
    dst[2 * i + 1] = f.y;
  }
}

// Eight fp8 elements (8 bytes) widened to fp32, two at a time through fp16
// (both formats are exact in fp16): cuda_fp8.h's conversion is the hardware
// cvt on sm_89 and later, its software emulation on sm_80.
__device__ __forceinline__ void widen8_fp8(const void* src, __nv_fp8_interpretation_t kind, float (&dst)[8]) {
  const uint2 raw = *reinterpret_cast<const uint2*>(src);
  const __nv_fp8x2_storage_t* pairs = reinterpret_cast<const __nv_fp8x2_storage_t*>(&raw);
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const float2 f = __half22float2(__half2(__nv_cvt_fp8x2_to_halfraw2(pairs[i], kind)));
    dst[2 * i] = f.x;
    dst[2 * i + 1] = f.y;
  }
}

__device__ __forceinline__ void widen8(const __nv_fp8_e4m3* src, float (&dst)[8]) {
  widen8_fp8(src, __NV_E4M3, dst);
}

__device__ __forceinline__ void widen8(const __nv_fp8_e5m2* src, float (&dst)[8]) {
  widen8_fp8(src, __NV_E5M2, dst);
}

}  // namespace pagoda::cuda
