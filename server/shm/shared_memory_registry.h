#pragma once
// Shared-memory regions (docs/design.md §15): a co-located client registers a
// range of a POSIX shared-memory object under a name; tensors of its later
// calls name a range of a region instead of carrying bytes, and results can
// be written into one. Regions belong to the registering tenant: another
// tenant's name is unknown to it, with the same message. A region is held by
// shared pointer: unregistering it while a call uses it keeps it mapped until
// that call lets go.

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "cache/tenant.h"
#include "pagoda/status.h"

namespace pagoda {

// One mapped region; unmapped when the last holder lets go.
class SharedMemoryRegion {
 public:
  // Maps [offset, offset + byte_size) of the object `key` read-write.
  // INVALID_ARGUMENT for a bad key, offset or size (or a range past the
  // object's end, naming both sizes); NOT_FOUND when no such object exists;
  // PERMISSION_DENIED or INTERNAL when it cannot be opened or mapped.
  static StatusOr<std::shared_ptr<SharedMemoryRegion>> map(const std::string& name, const std::string& key,
                                                           int64_t offset, int64_t byte_size);
  ~SharedMemoryRegion();
  SharedMemoryRegion(const SharedMemoryRegion&) = delete;
  SharedMemoryRegion& operator=(const SharedMemoryRegion&) = delete;

  const std::string& name() const { return name_; }
  const std::string& key() const { return key_; }
  int64_t offset() const { return offset_; }
  int64_t byte_size() const { return byte_size_; }
  std::byte* data() const { return data_; }

 private:
  SharedMemoryRegion() = default;
  std::string name_;
  std::string key_;
  int64_t offset_ = 0;
  int64_t byte_size_ = 0;
  void* mapping_ = nullptr;  // page-aligned start of the mapping
  size_t mapping_bytes_ = 0;
  std::byte* data_ = nullptr;  // mapping_ + (offset - page-aligned offset)
};

// A range of a region, pinned while held.
struct SharedMemorySpan {
  std::shared_ptr<const SharedMemoryRegion> region;
  std::byte* data = nullptr;
  int64_t byte_size = 0;
};

class SharedMemoryRegistry {
 public:
  // `enabled` false: every call is FAILED_PRECONDITION naming --allow-shared-memory.
  explicit SharedMemoryRegistry(bool enabled) : enabled_(enabled) {}

  bool enabled() const { return enabled_; }
  // ALREADY_EXISTS when `tenant` has a region of that name.
  Status add(TenantId tenant, const std::string& name, const std::string& key, int64_t offset, int64_t byte_size);
  // Empty name: every region of `tenant`. NOT_FOUND for an unknown name.
  Status remove(TenantId tenant, const std::string& name);
  // The caller's regions (one, or all when `name` is empty), by name.
  StatusOr<std::vector<std::shared_ptr<const SharedMemoryRegion>>> status(TenantId tenant,
                                                                           const std::string& name) const;
  // [offset, offset + byte_size) of `tenant`'s region `region`, for the field
  // `field` (e.g. "q.shm"): INVALID_ARGUMENT naming the region, the offset,
  // the size and the region's size when out of bounds, or an unknown region.
  StatusOr<SharedMemorySpan> resolve(TenantId tenant, const std::string& field, const std::string& region,
                                     int64_t offset, int64_t byte_size) const;

 private:
  Status off() const;

  const bool enabled_;
  mutable std::mutex mu_;
  std::map<std::pair<TenantId, std::string>, std::shared_ptr<const SharedMemoryRegion>> regions_;
};

}  // namespace pagoda
