#include "shm/shared_memory_registry.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

namespace pagoda {
namespace {

// POSIX names a shared-memory object "/name": one leading slash, no other.
bool valid_key(const std::string& key) {
  return key.size() >= 2 && key.size() <= 255 && key[0] == '/' && key.find('/', 1) == std::string::npos;
}

}  // namespace

StatusOr<std::shared_ptr<SharedMemoryRegion>> SharedMemoryRegion::map(const std::string& name, const std::string& key,
                                                                       int64_t offset, int64_t byte_size) {
  if (!valid_key(key)) {
    return InvalidArgument("key: expected a POSIX shared-memory name ('/' then 1 to 254 characters, no other '/'), "
                           "received '{}'",
                           key);
  }
  if (offset < 0) return InvalidArgument("offset: expected >= 0, received {}", offset);
  if (byte_size <= 0) return InvalidArgument("byte_size: expected > 0, received {}", byte_size);
  const int fd = shm_open(key.c_str(), O_RDWR, 0);
  if (fd < 0) {
    const int err = errno;
    if (err == ENOENT) return NotFound("key: no shared-memory object '{}'", key);
    return Status(err == EACCES ? StatusCode::kPermissionDenied : StatusCode::kInternal,
                  fmt::format("key: cannot open shared-memory object '{}': {}", key, std::strerror(err)));
  }
  struct stat st {};
  if (fstat(fd, &st) != 0) {
    const int err = errno;
    close(fd);
    return Internal("key: cannot stat shared-memory object '{}': {}", key, std::strerror(err));
  }
  if (offset > st.st_size || byte_size > st.st_size - offset) {
    close(fd);
    return InvalidArgument("offset + byte_size: expected at most the size of '{}' ({} bytes), received {} + {}", key,
                           static_cast<int64_t>(st.st_size), offset, byte_size);
  }
  const int64_t page = sysconf(_SC_PAGESIZE);
  const int64_t aligned = offset / page * page;
  const auto bytes = static_cast<size_t>(byte_size + (offset - aligned));
  void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, static_cast<off_t>(aligned));
  const int err = errno;
  close(fd);  // the mapping keeps the object
  if (p == MAP_FAILED) return Internal("key: cannot map '{}' ({} bytes): {}", key, bytes, std::strerror(err));
  std::shared_ptr<SharedMemoryRegion> r(new SharedMemoryRegion());
  r->name_ = name;
  r->key_ = key;
  r->offset_ = offset;
  r->byte_size_ = byte_size;
  r->mapping_ = p;
  r->mapping_bytes_ = bytes;
  r->data_ = static_cast<std::byte*>(p) + (offset - aligned);
  return r;
}

SharedMemoryRegion::~SharedMemoryRegion() {
  if (mapping_ != nullptr) munmap(mapping_, mapping_bytes_);
}

Status SharedMemoryRegistry::off() const {
  return Status(StatusCode::kFailedPrecondition,
                "shared memory: expected a server started with --allow-shared-memory, received a call using it");
}

Status SharedMemoryRegistry::add(TenantId tenant, const std::string& name, const std::string& key, int64_t offset,
                                 int64_t byte_size) {
  if (!enabled_) return off();
  if (name.empty() || name.size() > 128) {
    return InvalidArgument("name: expected 1 to 128 bytes, received {}", name.size());
  }
  {
    std::lock_guard lock(mu_);
    if (regions_.count({tenant, name}) > 0) {
      return Status(StatusCode::kAlreadyExists, fmt::format("name: a region '{}' is registered already", name));
    }
  }
  // Mapped outside the lock (a system call); a racing add of the same name loses below.
  StatusOr<std::shared_ptr<SharedMemoryRegion>> region = SharedMemoryRegion::map(name, key, offset, byte_size);
  if (!region.ok()) return region.status();
  std::lock_guard lock(mu_);
  if (!regions_.emplace(std::make_pair(tenant, name), *region).second) {
    return Status(StatusCode::kAlreadyExists, fmt::format("name: a region '{}' is registered already", name));
  }
  return Status::Ok();
}

Status SharedMemoryRegistry::remove(TenantId tenant, const std::string& name) {
  if (!enabled_) return off();
  std::lock_guard lock(mu_);
  if (name.empty()) {
    for (auto it = regions_.lower_bound({tenant, std::string()}); it != regions_.end() && it->first.first == tenant;) {
      it = regions_.erase(it);
    }
    return Status::Ok();
  }
  if (regions_.erase({tenant, name}) == 0) return NotFound("name: no shared-memory region '{}'", name);
  return Status::Ok();
}

StatusOr<std::vector<std::shared_ptr<const SharedMemoryRegion>>> SharedMemoryRegistry::status(
    TenantId tenant, const std::string& name) const {
  if (!enabled_) return off();
  std::vector<std::shared_ptr<const SharedMemoryRegion>> out;
  std::lock_guard lock(mu_);
  if (!name.empty()) {
    auto it = regions_.find({tenant, name});
    if (it == regions_.end()) return NotFound("name: no shared-memory region '{}'", name);
    out.push_back(it->second);
    return out;
  }
  for (auto it = regions_.lower_bound({tenant, std::string()}); it != regions_.end() && it->first.first == tenant;
       ++it) {
    out.push_back(it->second);
  }
  return out;
}

StatusOr<SharedMemorySpan> SharedMemoryRegistry::resolve(TenantId tenant, const std::string& field,
                                                         const std::string& region, int64_t offset,
                                                         int64_t byte_size) const {
  if (!enabled_) {
    return Status(StatusCode::kFailedPrecondition,
                  fmt::format("{}: expected a server started with --allow-shared-memory, received a shared-memory "
                              "tensor",
                              field));
  }
  std::shared_ptr<const SharedMemoryRegion> r;
  {
    std::lock_guard lock(mu_);
    auto it = regions_.find({tenant, region});
    if (it != regions_.end()) r = it->second;
  }
  if (r == nullptr) return InvalidArgument("{}.region: expected a registered region, received '{}'", field, region);
  if (offset < 0 || byte_size < 0 || offset > r->byte_size() || byte_size > r->byte_size() - offset) {
    return InvalidArgument("{}: expected offset + byte_size within region '{}' ({} bytes), received offset {} and "
                           "byte_size {}",
                           field, region, r->byte_size(), offset, byte_size);
  }
  return SharedMemorySpan{r, r->data() + offset, byte_size};
}

}  // namespace pagoda
