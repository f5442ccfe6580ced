#pragma once
// The CPU backend's SIMD targets, as benchmarks and tests choose and report
// them (the kernels dispatch at run time through Highway; kernels/cpu).

#include <cstdint>
#include <optional>
#include <string>

#include "pagoda/dtype.h"
#include "pagoda/paged_kv.h"
#include "pagoda/status.h"

namespace pagoda::cpu {

// Name of the SIMD target the dispatcher runs (for logs and benches), e.g. "AVX3", "AVX2".
const char* simd_target_name();

// Which caches "best" gives a matrix unit, as the flags' help says it (the
// rule is dot_min_group and matrix_unit_for, kernels/cpu/simd_target.cc).
inline constexpr const char* kBestTargetRule =
    "AMX tiles for a bf16 or fp8 cache of GQA 8 or wider, else AVX512-BF16 dot products for bf16 from GQA 4 and "
    "fp8 from GQA 8 (on AMD Zen 5 from GQA 4, e5m2 from head_dim 128)";

// Restricts dispatch to `target`: "best" (every target this CPU has, a matrix
// unit for the bf16 and fp8 caches where it is the faster: kBestTargetRule), "amx" (AMX for every bf16 and
// fp8 cache, failing where there is none), "avx512bf16" (AVX512-BF16 dot
// products for every bf16 and fp8 cache, failing where there are none), "avx3"
// (AVX-512, bf16 caches in fp32 FMAs) or "avx2". FAILED_PRECONDITION when the
// CPU lacks it. Affects the whole process; call before any decode runs
// (benches, tests, server start-up).
Status select_simd_target(const std::string& target);

// Where the kernel's tasks put the K/V lines they request ahead of their reads
// (the runs of one KV head are 4 KiB pieces a block stride apart, which
// hardware prefetchers do not follow): "auto" (the levels measured faster on
// this CPU family: L1 on AMD Zen 5; elsewhere L2 for the memory-bound FMA
// tasks of up to 8 rows and for the AVX512-BF16 dot products, L1 for wider
// FMA tasks and the AMX tiles), "l1" or "l2" for every path. INVALID_ARGUMENT
// for anything else. Changes no bits. Affects the whole process; call before
// any decode runs.
Status select_prefetch_level(const std::string& level);

// The levels in force, e.g. "L1", or per path where they differ.
std::string prefetch_level_name();

// How far ahead the tasks request lines on this CPU, e.g. "32 rows ahead", or
// per path where they differ: "48 rows ahead (tasks of up to 8 rows, wider FMA
// tasks), 32 (wider matrix-unit tasks)".
std::string prefetch_distance_name();

// The unit that multiplies a bf16 (or fp8, widened) cache's Q.K^T and P.V in
// bf16 with fp32 accumulation, instead of fp32 FMAs.
enum class MatrixUnit : uint8_t {
  kNone,        // fp32 FMAs on the SIMD target
  kAmx,         // AMX tiles (TDPBF16PS)
  kAvx512Bf16,  // AVX512-BF16 dot products (VDPBF16PS)
};

// Which unit decodes of geometry g take: a bf16 or fp8 cache (fp8 widens to
// bf16 exactly) on the AVX3 target of a CPU that has the unit, with enough
// query heads per KV head under "best" (AMX: 8; AVX512-BF16 where there is no
// AMX: 4 for bf16, 8 for fp8, but on AMD Zen 5 4 for e4m3, and for e5m2 from
// head_dim 128) or any under the
// unit's own target. A property of the geometry and the process, never of a
// batch or of a request's q_len.
MatrixUnit matrix_unit_for(const CacheGeometry& g);

// Whether decodes of geometry g take the AMX path (matrix_unit_for is kAmx).
bool amx_serves(const CacheGeometry& g);

// Whether decodes of geometry g compute in bf16 with fp32 accumulation
// (matrix_unit_for is not kNone): the tests' error bound for them.
bool bf16_unit_serves(const CacheGeometry& g);

// Whether decodes of geometry g widen its fp8 elements through AVX-512 VBMI
// byte tables (an fp8 cache on the AVX3 target of a CPU with VBMI, unless
// use_fp8_tables(false)): the values of the arithmetic widening, bit for bit,
// in fewer instructions, each element widened once into a tile.
bool fp8_tables_serve(const CacheGeometry& g);

// Turns the fp8 byte tables off (or back on, the default) for the whole
// process: for the tests and benches that compare both widenings. Call
// before any decode runs.
void use_fp8_tables(bool on);

// Whether an fp16 cache shared by many row blocks (AVX-512's quad scores,
// AVX2's tasks of 9 to 16 rows), and on AVX2 an fp8 cache's fp16 tile past 4
// rows, is read through an fp32 tile widened once
// (fp16_shared_through_tile of this CPU's family in kernels/cpu/cpu_family.h)
// rather than in place, unless force_fp16_tile said otherwise. The same
// values in the same order either way: a speed choice, never a bit change.
bool fp16_tile_serves();

// Forces the fp16 tile on or off for the whole process, or (nullopt)
// back to this CPU family's choice: for the tests and benches that compare
// both reads. Call before any decode runs.
void force_fp16_tile(std::optional<bool> on);

// What decodes of geometry g run on: the SIMD target, "+AMX-BF16" or
// "+AVX512-BF16" added where a matrix unit serves it, "+VBMI" where fp8 byte
// tables do, e.g. "AVX3+AMX-BF16" or "AVX3+VBMI".
std::string kernel_target_name(const CacheGeometry& g);

// Whether this CPU and its kernel offer AMX-BF16 (whatever the selection).
bool amx_available();

// Whether this CPU offers AVX512-BF16 (whatever the selection).
bool avx512_bf16_available();

// TDPBF16PS throughput of `threads` threads, FLOP/s (2 per multiply-add); 0
// without AMX. The compute roof of the bf16 rows on the AMX path.
double measure_amx_peak(int32_t threads);

// 512-bit VDPBF16PS throughput of `threads` threads, FLOP/s; 0 without
// AVX512-BF16. The compute roof of the bf16 rows on the dot-product path.
double measure_bf16_dot_peak(int32_t threads);

// The compute roof of geometry g's decodes on `threads` threads: the peak of
// the unit matrix_unit_for(g) names (the FMAs for kNone).
double measure_compute_peak(const CacheGeometry& g, int32_t threads);

// Fused multiply-add throughput of `threads` threads on the dispatched target,
// FLOP/s (2 per lane per FMA), from a register-resident loop: the compute roof
// a kernel's FLOPs are measured against.
double measure_fma_peak(int32_t threads);

}  // namespace pagoda::cpu
