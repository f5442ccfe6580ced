#pragma once
// The CPU backend's SIMD targets, as benchmarks and tests choose and report
// them (the kernels dispatch at run time through Highway; kernels/cpu).

#include <cstdint>
#include <string>

#include "pagoda/dtype.h"
#include "pagoda/paged_kv.h"
#include "pagoda/status.h"

namespace pagoda::cpu {

// Name of the SIMD target the dispatcher runs (for logs and benches), e.g. "AVX3", "AVX2".
const char* simd_target_name();

// Restricts dispatch to `target`: "best" (every target this CPU has, AMX for
// the bf16 caches where it is the faster: 8 or more query heads per KV head),
// "amx" (AMX for every bf16 cache, failing where there is none), "avx3"
// (AVX-512, bf16 caches in fp32 FMAs) or "avx2". FAILED_PRECONDITION
// when the CPU lacks it. Affects the whole process; call before any decode
// runs (benches, tests, server start-up).
Status select_simd_target(const std::string& target);

// What decodes of geometry g run on: the SIMD target, "+AMX-BF16" added where
// the matrix units serve it (amx_serves), e.g. "AVX3+AMX-BF16".
std::string kernel_target_name(const CacheGeometry& g);

// Whether decodes of geometry g take the AMX path (bf16 tiles): a bf16 or
// fp8 cache (fp8 widens to bf16 exactly) on a CPU with AMX-BF16, with 8 or more query heads per KV head under "best"
// or any under "amx". A property of the geometry and the process, never of a
// batch.
bool amx_serves(const CacheGeometry& g);

// Whether this CPU and its kernel offer AMX-BF16 (whatever the selection).
bool amx_available();

// TDPBF16PS throughput of `threads` threads, FLOP/s (2 per multiply-add); 0
// without AMX. The compute roof of the bf16 rows on the AMX path.
double measure_amx_peak(int32_t threads);

// Fused multiply-add throughput of `threads` threads on the dispatched target,
// FLOP/s (2 per lane per FMA), from a register-resident loop: the compute roof
// a kernel's FLOPs are measured against.
double measure_fma_peak(int32_t threads);

}  // namespace pagoda::cpu
