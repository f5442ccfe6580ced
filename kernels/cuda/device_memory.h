#pragma once
// Owning buffers of device memory and of pinned host memory. reserve() grows a
// buffer geometrically and only when a request needs more than any before it,
// so that steady-state launches allocate nothing. Growing drops the contents;
// callers only grow between launches (the stream is idle then).

#include <cstddef>

#include "pagoda/status.h"

namespace pagoda::cuda {

class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  ~DeviceBuffer();
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  // Exactly `bytes` (the pools); later reserve() calls may grow it.
  Status allocate(size_t bytes);
  Status reserve(size_t bytes);
  void* data() const { return data_; }
  size_t capacity() const { return capacity_; }

 private:
  void release();
  void* data_ = nullptr;
  size_t capacity_ = 0;
};

class PinnedBuffer {
 public:
  PinnedBuffer() = default;
  ~PinnedBuffer();
  PinnedBuffer(const PinnedBuffer&) = delete;
  PinnedBuffer& operator=(const PinnedBuffer&) = delete;

  Status reserve(size_t bytes);
  unsigned char* data() const { return data_; }
  size_t capacity() const { return capacity_; }

 private:
  void release();
  unsigned char* data_ = nullptr;
  size_t capacity_ = 0;
};

// Bytes rounded up to a multiple of 256 (cudaMalloc's alignment), so that the
// sub-buffers packed into one buffer keep 16-byte vector loads aligned.
constexpr size_t align_up(size_t bytes, size_t alignment = 256) {
  return (bytes + alignment - 1) / alignment * alignment;
}

}  // namespace pagoda::cuda
