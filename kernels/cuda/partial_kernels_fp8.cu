// The partial kernel's fp8 instances, e4m3 and e5m2 (one file per cache dtype
// family keeps nvcc's compile parallel).
#include "cuda/partial_kernel.cuh"

namespace pagoda::cuda {
namespace {

using E4M3 = __nv_fp8_e4m3;
using E5M2 = __nv_fp8_e5m2;
constexpr PartialKernel kKernels[] = {
    {DType::kFloat8E4M3, 64, &launch_partial<E4M3, 64>, &partial_ctas_per_sm<E4M3, 64>},
    {DType::kFloat8E4M3, 128, &launch_partial<E4M3, 128>, &partial_ctas_per_sm<E4M3, 128>},
    {DType::kFloat8E4M3, 256, &launch_partial<E4M3, 256>, &partial_ctas_per_sm<E4M3, 256>},
    {DType::kFloat8E5M2, 64, &launch_partial<E5M2, 64>, &partial_ctas_per_sm<E5M2, 64>},
    {DType::kFloat8E5M2, 128, &launch_partial<E5M2, 128>, &partial_ctas_per_sm<E5M2, 128>},
    {DType::kFloat8E5M2, 256, &launch_partial<E5M2, 256>, &partial_ctas_per_sm<E5M2, 256>},
};

}  // namespace

std::span<const PartialKernel> partial_kernels_fp8() { return kKernels; }

}  // namespace pagoda::cuda
