#pragma once
// The x86 vendor and family of this CPU: the per-core choices measured on one
// family (prefetch_levels.h, the matrix units' groups in simd_target.cc) key
// on it.

#include <cstdint>

namespace pagoda::cpu {

// Base plus extended family, as AMD and Intel number them: 0x19 Zen 3 and 4,
// 0x1A Zen 5, 6 for Intel's cores.
struct CpuFamily {
  bool amd = false;
  uint32_t family = 0;
};
inline constexpr uint32_t kZen5Family = 0x1A;

// From CPUID, read once per process; {false, 0} where it cannot be read.
CpuFamily this_cpu_family();

// AMD Zen 5 or a later AMD family.
inline bool zen5_or_later(CpuFamily cpu) { return cpu.amd && cpu.family >= kZen5Family; }

// Whether a 16-bit cache read by many row blocks goes through an fp32 tile
// widened once rather than widened where it lies by every block: AVX-512's quad
// scores (GQA 8 and wider; each key's four elements then one 128-bit broadcast
// load), AVX2's tasks of 9 to 16 rows of an fp16 or a bf16 cache (bf16's shift
// or mask also issues on an FMA port on Intel's cores), K and V, and AVX2's fp8
// caches past 4 rows (through their fp16 tile, kHalfTile). On Intel's cores
// 512-bit widenings issue on the two FMA ports and the tile is faster (Ice
// Lake: 0.90-0.97x the time on one thread, 0.91-1.01x on two); AMD's widenings
// have pipes of their own: in place, Zen 5's quads took 1.06-1.07x the time
// through the tile, Zen 3's AVX2 tasks of 16 rows 1.06x, and its fp8 tasks of 8
// to 64 rows 1.05-1.32x through an fp32 tile (docs/design.md §7). The same
// values in the same order: no bit changes either way.
inline bool fp16_shared_through_tile(CpuFamily cpu) { return !cpu.amd; }

}  // namespace pagoda::cpu
