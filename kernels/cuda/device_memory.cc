#include "cuda/device_memory.h"

#include <cuda_runtime_api.h>

#include "cuda/cuda_check.h"

namespace pagoda::cuda {
namespace {

size_t grown(size_t capacity, size_t bytes) {
  const size_t doubled = capacity * 2;
  return bytes > doubled ? bytes : doubled;
}

}  // namespace

DeviceBuffer::~DeviceBuffer() { release(); }

void DeviceBuffer::release() {
  if (data_ != nullptr) (void)cudaFree(data_);
  data_ = nullptr;
  capacity_ = 0;
}

Status DeviceBuffer::allocate(size_t bytes) {
  release();
  if (bytes == 0) return Status::Ok();
  PAGODA_CUDA_RETURN_IF_ERROR(cudaMalloc(&data_, bytes));
  capacity_ = bytes;
  return Status::Ok();
}

Status DeviceBuffer::reserve(size_t bytes) {
  if (bytes <= capacity_) return Status::Ok();
  return allocate(grown(capacity_, bytes));
}

PinnedBuffer::~PinnedBuffer() { release(); }

void PinnedBuffer::release() {
  if (data_ != nullptr) (void)cudaFreeHost(data_);
  data_ = nullptr;
  capacity_ = 0;
}

Status PinnedBuffer::reserve(size_t bytes) {
  if (bytes <= capacity_) return Status::Ok();
  const size_t size = grown(capacity_, bytes);
  release();
  void* p = nullptr;
  PAGODA_CUDA_RETURN_IF_ERROR(cudaMallocHost(&p, size));
  data_ = static_cast<unsigned char*>(p);
  capacity_ = size;
  return Status::Ok();
}

}  // namespace pagoda::cuda
