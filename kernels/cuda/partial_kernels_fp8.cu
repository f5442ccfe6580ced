// The partial kernel's fp8 instances, e4m3 and e5m2, one per head dim of the
// vocabulary each (one file per cache dtype family keeps nvcc's compile
// parallel).
#include "cuda/partial_kernel.cuh"

namespace pagoda::cuda {
namespace {

constexpr auto kKernels = concat(partial_instances<__nv_fp8_e4m3>(DType::kFloat8E4M3),
                                 partial_instances<__nv_fp8_e5m2>(DType::kFloat8E5M2));

}  // namespace

std::span<const PartialKernel> partial_kernels_fp8() { return kKernels; }

}  // namespace pagoda::cuda
