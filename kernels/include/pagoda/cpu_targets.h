#pragma once
// The CPU backend's SIMD targets, as benchmarks and tests choose and report
// them (the kernels dispatch at run time through Highway; kernels/cpu).

#include <cstdint>
#include <string>

#include "pagoda/status.h"

namespace pagoda::cpu {

// Name of the SIMD target the dispatcher runs (for logs and benches), e.g. "AVX3", "AVX2".
const char* simd_target_name();

// Restricts dispatch to `target`: "best" (every target this CPU has), "avx3"
// (AVX-512) or "avx2". FAILED_PRECONDITION when the CPU lacks it. Affects the
// whole process; call before any decode runs (benches and tests).
Status select_simd_target(const std::string& target);

// Fused multiply-add throughput of `threads` threads on the dispatched target,
// FLOP/s (2 per lane per FMA), from a register-resident loop: the compute roof
// a kernel's FLOPs are measured against.
double measure_fma_peak(int32_t threads);

}  // namespace pagoda::cpu
