// Which SIMD target the CPU kernels dispatch to, and the compute roof of the
// machine on that target.
#include <hwy/targets.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <thread>
#include <vector>

#include "cpu/amx_tiles.h"
#include "cpu/bf16_dot.h"
#include "cpu/cpu_family.h"
#include "cpu/decode_cpu.h"
#include "cpu/dot_groups.h"
#include "cpu/fp8_tables.h"

namespace pagoda::cpu {

double fma_peak_one_thread();  // decode_cpu.cc, per target

namespace {
// Which bf16 caches take a matrix unit: "best" those where it is the faster
// (kAmxMinGroup, dot_min_group), "amx" or "avx512bf16" every one on that unit, "avx3" and
// "avx2" none.
enum class UnitUse { kWhereFaster, kEveryAmx, kEveryDot, kNone };
std::atomic<UnitUse> g_unit_use{UnitUse::kWhereFaster};
std::atomic<bool> g_fp8_tables{true};
// force_fp16_tile: -1 this family's choice, 0 off, 1 on.
std::atomic<int> g_fp16_tile{-1};

// From 8 query heads per KV head, where a 16-row tile holds 8 or more rows
// per position. Measured on a 2-vCPU Sapphire Rapids guest (bf16, head_dim
// 128, 8 x 4096 tokens, 2 threads) against the AVX-512 FMAs: GQA 8 at 1.2-1.4x
// their speed for one query row and 2.2-2.6x for four, MLA's 128 heads at
// 2.9x; GQA 4 at 0.6-1.0x for one row (1.5-1.9x for four), GQA 2 at 0.74x,
// GQA 1 at 0.67x.
constexpr int32_t kAmxMinGroup = 8;
}  // namespace

// The dot products skip a block's padding rows in P.V and score up to 8 rows
// with keys in the lanes too, so narrower groups cost them less than the
// tiles. Measured on a 2-vCPU AMD EPYC (Zen 4) guest, same shape, against the
// AVX-512 FMAs (`make bench`, three runs, with up to 8 rows scored in
// half-width vectors): bf16 GQA 4 at 1.04-1.15x for one query row and 2.0x
// for four, GQA 8 at 1.2-1.3x and 1.9-2.0x, MLA's 32 heads at 2.1x; fp8 e4m3
// GQA 8 at 1.1-1.2x and 1.8-1.9x, but GQA 4 at 0.70x for one row (the FMA path
// reads fp8 in place, the dot products widen each tile to bf16 first; 1.6x
// for four). On a 2-vCPU Zen 5 guest with the keys in the lanes (five runs):
// e4m3 GQA 4 at 1.09x for one row and 1.5x for four (head_dim 64: 0.98x, level);
// GQA 2 stays on the FMAs (bf16 0.91x for one row). With fp8 operands packed
// from their codes (six runs each): e4m3 GQA 4 at head_dim 64 1.1x for one
// row; e5m2, which the FMAs read in place in one shift, GQA 4 at 1.03x for one
// row and 1.7x for four at head_dim 128, but 0.89x for one row at head_dim 64
// (1.4x for four): it takes them from head_dim 128. bf16 GQA 4 with one query
// row has since measured at 0.82-1.01x the FMAs' speed on Zen 5 (9 runs of
// best against avx3; the FMAs read bf16 in place at about 0.9 of the read
// bandwidth there) while four rows run 1.4x faster on the dot products: the
// unit is chosen by geometry, not by rows (a draft row keeps its single-step
// bits), so bf16 GQA 4 stays on the dot products.
int32_t dot_min_group(DType dtype, int32_t head_dim, CpuFamily cpu) {
  if (zen5_or_later(cpu)) {
    if (dtype == DType::kFloat8E4M3) return 4;
    if (dtype == DType::kFloat8E5M2 && head_dim >= 128) return 4;
  }
  return is_fp8(dtype) ? 8 : 4;
}

Status select_simd_target(const std::string& target) {
  // Targets better than AVX2 on x86 (AVX3_DL is compiled only under
  // HWY_WANT_AVX3_DL, which this build leaves unset).
  const int64_t above_avx2 = HWY_AVX3 | HWY_AVX3_DL;
  hwy::SetSupportedTargetsForTest(0);  // back to what the CPU has
  g_unit_use = UnitUse::kWhereFaster;
  const int64_t supported = hwy::SupportedTargets();
  if (target == "best") return Status::Ok();
  if (target == "amx") {
    if (!amx::available()) {
      return Status(StatusCode::kFailedPrecondition,
                    "target: expected a CPU with AMX-BF16, AMX-TILE and AVX512-BF16 whose kernel grants the tile "
                    "data for 'amx', this CPU or kernel has none");
    }
    g_unit_use = UnitUse::kEveryAmx;
    return Status::Ok();
  }
  if (target == "avx512bf16") {
    if (!bf16dot::available() || (supported & HWY_AVX3) == 0) {
      return Status(StatusCode::kFailedPrecondition,
                    "target: expected a CPU with AVX512-BF16 (and AVX-512 F, VL, DQ, BW) for 'avx512bf16', this CPU "
                    "has none");
    }
    g_unit_use = UnitUse::kEveryDot;
    return Status::Ok();
  }
  if (target == "avx3") {
    if ((supported & HWY_AVX3) == 0) {
      return Status(StatusCode::kFailedPrecondition,
                    "target: expected a CPU with AVX-512 (F, VL, DQ, BW) for 'avx3', this CPU has none");
    }
    g_unit_use = UnitUse::kNone;
    return Status::Ok();
  }
  if (target == "avx2") {
    if ((supported & HWY_AVX2) == 0) {
      return Status(StatusCode::kFailedPrecondition, "target: expected a CPU with AVX2 for 'avx2', this CPU has none");
    }
    hwy::SetSupportedTargetsForTest(supported & ~above_avx2);
    g_unit_use = UnitUse::kNone;
    return Status::Ok();
  }
  return InvalidArgument("target: expected best, amx, avx512bf16, avx3 or avx2, received '{}'", target);
}

// Both units are driven by an AVX3 function of decode_units_inl.h: the dispatched
// target must be that one.
MatrixUnit matrix_unit_for(const CacheGeometry& g) {
  const UnitUse use = g_unit_use.load(std::memory_order_relaxed);
  // bf16, and fp8 widened to bf16 exactly; fp32 and fp16 would lose bits.
  const bool bf16_holds_it = g.dtype == DType::kBFloat16 || is_fp8(g.dtype);
  if (!bf16_holds_it || use == UnitUse::kNone) return MatrixUnit::kNone;
  if (std::strcmp(simd_target_name(), "AVX3") != 0) return MatrixUnit::kNone;
  const int32_t group = g.group_size();
  switch (use) {
    case UnitUse::kEveryAmx: return amx::available() ? MatrixUnit::kAmx : MatrixUnit::kNone;
    case UnitUse::kEveryDot: return bf16dot::available() ? MatrixUnit::kAvx512Bf16 : MatrixUnit::kNone;
    case UnitUse::kWhereFaster:
      if (amx::available()) return group >= kAmxMinGroup ? MatrixUnit::kAmx : MatrixUnit::kNone;
      if (!bf16dot::available()) return MatrixUnit::kNone;
      return group >= dot_min_group(g.dtype, g.head_dim, this_cpu_family()) ? MatrixUnit::kAvx512Bf16 : MatrixUnit::kNone;
    case UnitUse::kNone: break;
  }
  return MatrixUnit::kNone;
}

bool amx_serves(const CacheGeometry& g) { return matrix_unit_for(g) == MatrixUnit::kAmx; }

bool bf16_unit_serves(const CacheGeometry& g) { return matrix_unit_for(g) != MatrixUnit::kNone; }

// The tables are AVX-512 code: only where the dispatched target is AVX3 (an
// "avx2" selection keeps to AVX2 instructions).
bool fp8_tables_serve(const CacheGeometry& g) {
  return is_fp8(g.dtype) && g_fp8_tables.load(std::memory_order_relaxed) && fp8tab::available() &&
         std::strcmp(simd_target_name(), "AVX3") == 0;
}

void use_fp8_tables(bool on) { g_fp8_tables = on; }

bool fp16_tile_serves() {
  const int forced = g_fp16_tile.load(std::memory_order_relaxed);
  return forced < 0 ? fp16_shared_through_tile(this_cpu_family()) : forced == 1;
}

void force_fp16_tile(std::optional<bool> on) { g_fp16_tile = on ? static_cast<int>(*on) : -1; }

std::string kernel_target_name(const CacheGeometry& g) {
  std::string name = simd_target_name();
  switch (matrix_unit_for(g)) {
    case MatrixUnit::kAmx: name += "+AMX-BF16"; break;
    case MatrixUnit::kAvx512Bf16: name += "+AVX512-BF16"; break;
    case MatrixUnit::kNone: break;
  }
  if (fp8_tables_serve(g)) name += "+VBMI";
  return name;
}

bool amx_available() { return amx::available(); }

bool avx512_bf16_available() { return bf16dot::available(); }

namespace {
// The sum over `threads` threads of one_thread()'s rate, best of three: a
// thread can lose its core for a moment on a shared machine.
double peak_of_threads(int32_t threads, double (*one_thread)()) {
  threads = std::max(1, threads);
  std::vector<double> rates(static_cast<size_t>(threads));
  double best = 0;
  for (int rep = 0; rep < 3; ++rep) {
    std::vector<std::thread> pool;
    for (int32_t i = 0; i < threads; ++i) {
      pool.emplace_back([&rates, i, one_thread] { rates[static_cast<size_t>(i)] = one_thread(); });
    }
    for (auto& t : pool) t.join();
    double total = 0;
    for (double r : rates) total += r;
    best = std::max(best, total);
  }
  return best;
}
}  // namespace

double measure_amx_peak(int32_t threads) {
  return amx::available() ? peak_of_threads(threads, &amx::peak_one_thread) : 0.0;
}

double measure_bf16_dot_peak(int32_t threads) {
  return bf16dot::available() ? peak_of_threads(threads, &bf16dot::peak_one_thread) : 0.0;
}

double measure_fma_peak(int32_t threads) { return peak_of_threads(threads, &fma_peak_one_thread); }

double measure_compute_peak(const CacheGeometry& g, int32_t threads) {
  switch (matrix_unit_for(g)) {
    case MatrixUnit::kAmx: return measure_amx_peak(threads);
    case MatrixUnit::kAvx512Bf16: return measure_bf16_dot_peak(threads);
    case MatrixUnit::kNone: break;
  }
  return measure_fma_peak(threads);
}

}  // namespace pagoda::cpu
