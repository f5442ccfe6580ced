// The partial kernel's fp32 instances (one file per cache dtype keeps nvcc's
// compile parallel).
#include "cuda/partial_kernel.cuh"

namespace pagoda::cuda {
namespace {

using Elem = float;
constexpr PartialKernel kKernels[] = {
    {DType::kFloat32, 64, &launch_partial<Elem, 64>, &partial_ctas_per_sm<Elem, 64>},
    {DType::kFloat32, 128, &launch_partial<Elem, 128>, &partial_ctas_per_sm<Elem, 128>},
    {DType::kFloat32, 256, &launch_partial<Elem, 256>, &partial_ctas_per_sm<Elem, 256>},
};

}  // namespace

std::span<const PartialKernel> partial_kernels_fp32() { return kKernels; }

}  // namespace pagoda::cuda
