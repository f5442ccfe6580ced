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

}  // namespace pagoda::cpu
