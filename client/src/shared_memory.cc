#include "pagoda/client/shared_memory.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <utility>

#include <fmt/format.h>

namespace pagoda::client {
namespace {

Result<SharedMemoryRegion> failed(const std::string& what, const std::string& key, int err) {
  return Error(err == ENOENT ? ErrorCode::kNotFound : ErrorCode::kInvalidArgument,
               fmt::format("{} '{}': {}", what, key, std::strerror(err)), "client");
}

}  // namespace

Result<SharedMemoryRegion> SharedMemoryRegion::create(const std::string& key, size_t bytes) {
  if (bytes == 0) return invalid_argument("bytes: expected > 0, received 0");
  const int fd = shm_open(key.c_str(), O_RDWR | O_CREAT | O_EXCL, 0600);
  if (fd < 0) return failed("cannot create shared-memory object", key, errno);
  if (ftruncate(fd, static_cast<off_t>(bytes)) != 0) {
    const int err = errno;
    close(fd);
    shm_unlink(key.c_str());
    return failed("cannot size shared-memory object", key, err);
  }
  void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  const int err = errno;
  close(fd);
  if (p == MAP_FAILED) {
    shm_unlink(key.c_str());
    return failed("cannot map shared-memory object", key, err);
  }
  SharedMemoryRegion r;
  r.key_ = key;
  r.size_ = bytes;
  r.data_ = static_cast<std::byte*>(p);
  r.owner_ = true;
  return r;
}

Result<SharedMemoryRegion> SharedMemoryRegion::open(const std::string& key) {
  const int fd = shm_open(key.c_str(), O_RDWR, 0);
  if (fd < 0) return failed("cannot open shared-memory object", key, errno);
  struct stat st {};
  if (fstat(fd, &st) != 0 || st.st_size <= 0) {
    const int err = errno;
    close(fd);
    return failed("cannot size shared-memory object", key, err != 0 ? err : EINVAL);
  }
  void* p = mmap(nullptr, static_cast<size_t>(st.st_size), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  const int err = errno;
  close(fd);
  if (p == MAP_FAILED) return failed("cannot map shared-memory object", key, err);
  SharedMemoryRegion r;
  r.key_ = key;
  r.size_ = static_cast<size_t>(st.st_size);
  r.data_ = static_cast<std::byte*>(p);
  return r;
}

SharedMemoryRegion::SharedMemoryRegion(SharedMemoryRegion&& other) noexcept { *this = std::move(other); }

SharedMemoryRegion& SharedMemoryRegion::operator=(SharedMemoryRegion&& other) noexcept {
  if (this != &other) {
    reset();
    key_ = std::move(other.key_);
    size_ = std::exchange(other.size_, 0);
    data_ = std::exchange(other.data_, nullptr);
    owner_ = std::exchange(other.owner_, false);
  }
  return *this;
}

SharedMemoryRegion::~SharedMemoryRegion() { reset(); }

void SharedMemoryRegion::reset() {
  if (data_ != nullptr) munmap(data_, size_);
  if (owner_) shm_unlink(key_.c_str());
  data_ = nullptr;
  owner_ = false;
}

}  // namespace pagoda::client
