// The partial kernel's bf16 instances, one per head dim of the vocabulary (one
// file per cache dtype keeps nvcc's compile parallel).
#include "cuda/partial_kernel.cuh"

namespace pagoda::cuda {
namespace {

constexpr auto kKernels = partial_instances<__nv_bfloat16>(DType::kBFloat16);

}  // namespace

std::span<const PartialKernel> partial_kernels_bf16() { return kKernels; }

}  // namespace pagoda::cuda
