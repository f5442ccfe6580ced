#pragma once
// How the processes that move tensors every call (the server, the bench, the
// CLI) keep freed memory in their heap instead of returning it to the kernel.
//
// glibc's malloc gives a heap's free top back to the kernel once it passes
// 128 KiB (madvise or brk), and serves blocks from 128 KiB up by mmap, freed by
// munmap. A process that allocates and frees a call's tensors every call
// (gRPC's message buffers, protobuf's bytes fields, the engine's batch
// buffers: 64 KiB of q and as much of output at batch 8) then faults those
// pages back in and flushes the TLB on every call. Raising both thresholds to
// 32 MiB keeps them: measured on the loopback service bench (AMD Zen 5 VM, 2
// cores, fp16, 32 q heads of 128, 16-token contexts), unary p50 at batch 8
// 0.74 -> 0.19 ms, batch 16 1.33 -> 0.36 ms, batch 64 4.1 -> 0.84 ms
// (docs/design.md, "A call's memory").
//
// The memory kept is what the process used at its peak, as jemalloc and
// tcmalloc keep it; blocks past 32 MiB still come from mmap.
#include <cstdint>
#include <string>

namespace pagoda {

struct HeapRetention {
  bool applied = false;
  int64_t trim_threshold = 0;  // bytes of free heap top kept (0: not set here)
  int64_t mmap_threshold = 0;  // smallest block served by mmap (0: not set here)
  std::string detail;          // for the start-up log line
};

inline constexpr int64_t kHeapRetentionBytes = int64_t{32} << 20;

// Sets glibc's M_TRIM_THRESHOLD and M_MMAP_THRESHOLD to kHeapRetentionBytes,
// unless `glibc_tunables` (the GLIBC_TUNABLES environment variable) already
// sets a glibc.malloc tunable: the operator's choice stands. Not glibc: nothing.
HeapRetention retain_freed_heap(const char* glibc_tunables);

}  // namespace pagoda
