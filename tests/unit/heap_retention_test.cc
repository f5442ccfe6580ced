// retain_freed_heap: what it sets, that glibc then keeps a freed block in the
// heap (neither mmapped nor trimmed), and that GLIBC_TUNABLES takes precedence.
#include "pagoda/heap_retention.h"

#include <cstdlib>
#include <cstring>

#if defined(__GLIBC__)
#include <malloc.h>
#endif

#include <gtest/gtest.h>

// Under a sanitizer, malloc is the sanitizer's: mallopt is refused and
// mallinfo2 says nothing of its heap.
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define PAGODA_GLIBC_MALLOC 0
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer) || __has_feature(memory_sanitizer)
#define PAGODA_GLIBC_MALLOC 0
#endif
#endif
#if !defined(PAGODA_GLIBC_MALLOC)
#if defined(__GLIBC__)
#define PAGODA_GLIBC_MALLOC 1
#else
#define PAGODA_GLIBC_MALLOC 0
#endif
#endif

namespace pagoda {
namespace {

#if PAGODA_GLIBC_MALLOC
TEST(HeapRetention, SetsBothThresholds) {
  const HeapRetention r = retain_freed_heap(nullptr);
  EXPECT_TRUE(r.applied) << r.detail;
  EXPECT_EQ(r.trim_threshold, kHeapRetentionBytes);
  EXPECT_EQ(r.mmap_threshold, kHeapRetentionBytes);
  EXPECT_NE(r.detail.find("32 MiB"), std::string::npos) << r.detail;
}

// A 24 MiB block (below the threshold, far above glibc's 128 KiB default and
// anything its own adjustment reaches in this process) comes from the heap, not
// from mmap, and freeing it leaves the heap's size as it was.
TEST(HeapRetention, AFreedCallSizedBlockStaysInTheHeap) {
  ASSERT_TRUE(retain_freed_heap(nullptr).applied);
  constexpr size_t kBytes = size_t{24} << 20;
  const struct mallinfo2 before = mallinfo2();
  auto* block = static_cast<char*>(std::malloc(kBytes));
  ASSERT_NE(block, nullptr);
  std::memset(block, 1, kBytes);  // the pages exist
  volatile char* const kept = block;  // and the block is not elided with its free
  EXPECT_EQ(kept[kBytes - 1], 1);
  const struct mallinfo2 held = mallinfo2();
  EXPECT_EQ(held.hblkhd, before.hblkhd) << "the block was mmapped";
  EXPECT_GE(held.arena, before.arena + kBytes - (size_t{1} << 20));
  std::free(block);
  const struct mallinfo2 after = mallinfo2();
  EXPECT_GE(after.arena, held.arena) << "the heap gave the freed block back";
}
#endif

TEST(HeapRetention, AnOperatorsMallocTunableStands) {
  const HeapRetention r = retain_freed_heap("glibc.malloc.trim_threshold=1048576");
  EXPECT_FALSE(r.applied);
  EXPECT_EQ(r.trim_threshold, 0);
  EXPECT_EQ(r.mmap_threshold, 0);
  EXPECT_NE(r.detail.find("glibc.malloc.trim_threshold=1048576"), std::string::npos) << r.detail;
}

#if PAGODA_GLIBC_MALLOC
TEST(HeapRetention, OtherTunablesDoNotStopIt) {
  EXPECT_TRUE(retain_freed_heap("glibc.pthread.rseq=0").applied);
}
#endif

}  // namespace
}  // namespace pagoda
