#include "pagoda/heap_retention.h"

#include <string_view>

#if defined(__GLIBC__)
#include <malloc.h>
#endif

#include <fmt/format.h>

namespace pagoda {

HeapRetention retain_freed_heap(const char* glibc_tunables) {
  HeapRetention r;
#if defined(__GLIBC__)
  if (glibc_tunables != nullptr && std::string_view(glibc_tunables).find("glibc.malloc.") != std::string_view::npos) {
    r.detail = fmt::format("malloc as GLIBC_TUNABLES sets it ({})", glibc_tunables);
    return r;
  }
  // Setting either threshold also stops glibc from moving them itself.
  const bool trim = mallopt(M_TRIM_THRESHOLD, static_cast<int>(kHeapRetentionBytes)) == 1;
  const bool mmap = mallopt(M_MMAP_THRESHOLD, static_cast<int>(kHeapRetentionBytes)) == 1;
  r.applied = trim && mmap;
  r.trim_threshold = trim ? kHeapRetentionBytes : 0;
  r.mmap_threshold = mmap ? kHeapRetentionBytes : 0;
  r.detail = r.applied ? fmt::format("malloc keeps freed memory up to {} MiB (trim and mmap thresholds)",
                                     kHeapRetentionBytes >> 20)
                       : "malloc thresholds not set: the allocator refused them (a sanitizer's?)";
#else
  (void)glibc_tunables;
  r.detail = "malloc as the C library sets it (not glibc)";
#endif
  return r;
}

}  // namespace pagoda
