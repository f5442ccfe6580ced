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

// Whether quad scores (GQA 8 and wider on AVX-512) read an fp16 cache
// through an fp32 tile widened once, each key's four elements then one
// 128-bit broadcast load, rather than widening every replicated key where it
// lies. On Intel's cores 512-bit widenings issue on the two FMA ports and the
// tile is faster (Ice Lake: 0.90-0.97x the time on one thread, 0.91-1.01x on
// two); on AMD Zen 5, whose widenings have pipes of their own, it took
// 1.06-1.07x (docs/design.md §7).
// The same values in the same order: no bit changes either way.
inline bool quads_read_fp16_tile(CpuFamily cpu) { return !cpu.amd; }

}  // namespace pagoda::cpu
