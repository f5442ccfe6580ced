#pragma once
// Shared-memory tensors for a client on the server's host (docs/design.md §15):
// a POSIX shared-memory object this process creates or opens and maps, with
// typed views over byte ranges (no copy). Register it with
// Client::register_shared_memory on a server started with
// --allow-shared-memory; DecodeArgs' *_shm fields then name ranges of it in
// place of tensors, and where the server writes the results.

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>

#include "pagoda/client/error.h"

namespace pagoda::client {

// A range of a registered region, as a request names it.
struct ShmRef {
  std::string region;   // the name it was registered under
  int64_t offset = 0;   // bytes from the region's start
  int64_t byte_size = 0;
};

class SharedMemoryRegion {
 public:
  // Makes the object `key` ("/name") of `bytes` bytes (it must not exist) and
  // maps it; the object is removed when the region is destroyed.
  static Result<SharedMemoryRegion> create(const std::string& key, size_t bytes);
  // Maps an existing object whole.
  static Result<SharedMemoryRegion> open(const std::string& key);

  SharedMemoryRegion(SharedMemoryRegion&& other) noexcept;
  SharedMemoryRegion& operator=(SharedMemoryRegion&& other) noexcept;
  SharedMemoryRegion(const SharedMemoryRegion&) = delete;
  SharedMemoryRegion& operator=(const SharedMemoryRegion&) = delete;
  ~SharedMemoryRegion();

  const std::string& key() const { return key_; }
  size_t size() const { return size_; }
  std::byte* data() const { return data_; }
  // `count` elements of T at byte `offset` (the caller keeps them in range).
  template <typename T>
  std::span<T> view(size_t offset, size_t count) const {
    return {reinterpret_cast<T*>(data_ + offset), count};
  }

 private:
  SharedMemoryRegion() = default;
  void reset();

  std::string key_;
  size_t size_ = 0;
  std::byte* data_ = nullptr;
  bool owner_ = false;  // created here: unlinked on destruction
};

// One registered region as GetSharedMemoryStatus reports it.
struct SharedMemoryStatus {
  std::string name;
  std::string key;
  int64_t offset = 0;
  int64_t byte_size = 0;
};

}  // namespace pagoda::client
