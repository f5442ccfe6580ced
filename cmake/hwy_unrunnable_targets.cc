// Prints, as a decimal bit set, the Highway targets wider than AVX2 that this
// machine cannot run: what PAGODA_RUNNABLE_SIMD_ONLY leaves out of the kernels
// (kernels/cpu/CMakeLists.txt). Highway numbers x86 targets from the widest
// down, so every target wider than AVX2 has a lower bit.
#include <cstdint>
#include <cstdio>

#include <hwy/targets.h>

int main() {
  const int64_t wider_than_avx2 = HWY_AVX2 - 1;
  std::printf("%lld", static_cast<long long>(wider_than_avx2 & ~hwy::SupportedTargets()));
  return 0;
}
