// The partial kernel's bf16 instances (one file per cache dtype keeps nvcc's
// compile parallel).
#include "cuda/partial_kernel.cuh"

namespace pagoda::cuda {
namespace {

using Elem = __nv_bfloat16;
constexpr PartialKernel kKernels[] = {
    {DType::kBFloat16, 64, &launch_partial<Elem, 64>, &partial_ctas_per_sm<Elem, 64>},
    {DType::kBFloat16, 128, &launch_partial<Elem, 128>, &partial_ctas_per_sm<Elem, 128>},
    {DType::kBFloat16, 256, &launch_partial<Elem, 256>, &partial_ctas_per_sm<Elem, 256>},
};

}  // namespace

std::span<const PartialKernel> partial_kernels_bf16() { return kKernels; }

}  // namespace pagoda::cuda
