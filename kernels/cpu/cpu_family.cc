// The CPU's vendor and family from CPUID (cpu_family.h).
#include "cpu/cpu_family.h"

#include <cpuid.h>

#include <cstring>

namespace pagoda::cpu {

namespace {
CpuFamily read_cpu_family() {
  unsigned a = 0, b = 0, c = 0, d = 0;
  if (__get_cpuid(0, &a, &b, &c, &d) == 0) return {};
  char vendor[13] = {};
  std::memcpy(vendor, &b, 4);
  std::memcpy(vendor + 4, &d, 4);
  std::memcpy(vendor + 8, &c, 4);
  if (__get_cpuid(1, &a, &b, &c, &d) == 0) return {};
  const uint32_t base = (a >> 8) & 0xF;
  const uint32_t extended = (a >> 20) & 0xFF;
  return {std::strcmp(vendor, "AuthenticAMD") == 0, base == 0xF ? base + extended : base};
}
}  // namespace

CpuFamily this_cpu_family() {
  static const CpuFamily here = read_cpu_family();  // asked once: launches consult it
  return here;
}

}  // namespace pagoda::cpu
