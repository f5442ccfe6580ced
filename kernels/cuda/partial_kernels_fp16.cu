// The partial kernel's fp16 instances, one per head dim of the vocabulary (one
// file per cache dtype keeps nvcc's compile parallel).
#include "cuda/partial_kernel.cuh"

namespace pagoda::cuda {
namespace {

constexpr auto kKernels = partial_instances<__half>(DType::kFloat16);

}  // namespace

std::span<const PartialKernel> partial_kernels_fp16() { return kKernels; }

}  // namespace pagoda::cuda
