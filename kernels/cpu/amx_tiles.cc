// AMX tile multiplies of the CPU kernel's bf16 path (amx_tiles.h). Every
// function that touches tiles or AVX-512 BF16 carries the target attribute:
// the rest of the binary stays runnable on CPUs without them, and callers ask
// available() first.
#include "cpu/amx_tiles.h"

#include <cpuid.h>
#include <immintrin.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstring>

#include "cpu/bf16_blocks_inl.h"

#define PAGODA_AMX_TARGET __attribute__((target("amx-tile,amx-bf16,avx512f,avx512bw,avx512vl,avx512dq,avx512bf16")))

namespace pagoda::cpu::amx {
using bf16::kValuesPerTile;
using bf16::Spread;
using bf16::transpose16;

namespace {

// Linux's names (asm/prctl.h, uapi): the permission request for dynamically
// enabled XSAVE features, and the tile data's feature number.
constexpr int kArchGetXcompSupp = 0x1021;
constexpr int kArchReqXcompPerm = 0x1023;
constexpr int kXfeatureXtiledata = 18;

bool cpu_has_amx_bf16() {
  unsigned a = 0, b = 0, c = 0, d = 0;
  if (__get_cpuid_count(7, 0, &a, &b, &c, &d) == 0) return false;
  const bool tile = (d & (1u << 24)) != 0;
  const bool tile_bf16 = (d & (1u << 22)) != 0;
  return tile && tile_bf16 && bf16::cpu_has_avx512_bf16();
}

// The kernel must offer the tile data and grant it to the process; a kernel
// before 5.16, or a VM that hides it, says no here and the fp32 path runs.
bool os_grants_tile_data() {
  uint64_t features = 0;
  if (syscall(SYS_arch_prctl, kArchGetXcompSupp, &features) != 0) return false;
  if ((features & (uint64_t{1} << kXfeatureXtiledata)) == 0) return false;
  return syscall(SYS_arch_prctl, kArchReqXcompPerm, kXfeatureXtiledata) == 0;
}

// Palette 1: every tile register 16 rows of 64 bytes.
struct alignas(64) TileConfig {
  uint8_t palette = 1;
  uint8_t start_row = 0;
  uint8_t reserved[14] = {};
  uint16_t colsb[16] = {};
  uint8_t rows[16] = {};
};
static_assert(sizeof(TileConfig) == 64);

TileConfig make_config() {
  TileConfig c;
  for (int i = 0; i < 8; ++i) {
    c.colsb[i] = 64;
    c.rows[i] = kTileRows;
  }
  return c;
}
const TileConfig kConfig = make_config();

// Tiles: scores accumulate in 0 and 3, A in 1 and 4, B in 2; P.V accumulates
// in 0, 3, 5 and 6, A in 1, B in 2, 4 and 7 (peak_one_thread: 0..3
// accumulators, 4 and 5 operands).

}  // namespace

bool available() {
  static const bool yes = cpu_has_amx_bf16() && os_grants_tile_data();
  return yes;
}

namespace {
PAGODA_AMX_TARGET void load_config() { _tile_loadconfig(&kConfig); }
PAGODA_AMX_TARGET void release_tiles() { _tile_release(); }
}  // namespace

TileScope::TileScope() { load_config(); }
TileScope::~TileScope() { release_tiles(); }

PAGODA_AMX_TARGET void scores(const uint16_t* qb, int32_t d, const KeyRows* keys, int32_t groups, int32_t rows,
                              float scale, float* out, int64_t out_stride, Requests requests) {
  Spread spread(requests, d / 32 + groups);
  // Two groups of 16 keys go as two independent accumulators (tiles 0 and 3):
  // each one's chain over d then waits on the multiply's latency half as often.
  alignas(64) float st[2][kTileRows * kTileRows];  // [group][key][row]
  _tile_zero(0);
  _tile_zero(3);
  const auto* k0 = reinterpret_cast<const char*>(keys[0].k);
  const auto* k1 = groups > 1 ? reinterpret_cast<const char*>(keys[1].k) : k0;
  for (int32_t c = 0; c < d / 32; ++c) {
    _tile_loadd(2, qb + static_cast<int64_t>(c) * kValuesPerTile, 64);
    _tile_loadd(1, k0 + 64 * c, keys[0].stride);
    _tile_dpbf16ps(0, 1, 2);
    if (groups > 1) {
      _tile_loadd(4, k1 + 64 * c, keys[1].stride);
      _tile_dpbf16ps(3, 4, 2);
    }
    spread.tick();
  }
  _tile_stored(0, st[0], 64);
  if (groups > 1) _tile_stored(3, st[1], 64);
  const __m512 vs = _mm512_set1_ps(scale);
  for (int32_t gi = 0; gi < groups; ++gi) {
    __m512 s[kTileRows];
    transpose16(st[gi], s);
    const __mmask16 live = static_cast<__mmask16>((1u << keys[gi].n) - 1);
    float* o = out + gi * kTileRows;
    for (int32_t r = 0; r < rows; ++r) _mm512_mask_storeu_ps(o + r * out_stride, live, _mm512_mul_ps(s[r], vs));
    spread.tick();
  }
}

PAGODA_AMX_TARGET void accumulate(const uint16_t* pa, const uint16_t* vb, int32_t dv, float* acc,
                                  int64_t acc_stride, bool first) {
  const int64_t stride = acc_stride * static_cast<int64_t>(sizeof(float));
  _tile_loadd(1, pa, 64);
  // Four 16-column stretches at a time in four accumulators (tiles 0, 3, 5,
  // 6; B in 2, 4, 7, then 2 again): each one's load and store overlap the
  // others' multiplies. dv is a multiple of 32: a pair remains at most.
  int32_t t = 0;
  for (; t + 4 <= dv / 16; t += 4) {
    float* c = acc + 16 * t;
    const uint16_t* b = vb + static_cast<int64_t>(t) * kValuesPerTile;
    if (first) {
      _tile_zero(0);
      _tile_zero(3);
      _tile_zero(5);
      _tile_zero(6);
    } else {
      _tile_loadd(0, c, stride);
      _tile_loadd(3, c + 16, stride);
      _tile_loadd(5, c + 32, stride);
      _tile_loadd(6, c + 48, stride);
    }
    _tile_loadd(2, b, 64);
    _tile_loadd(4, b + kValuesPerTile, 64);
    _tile_loadd(7, b + 2 * kValuesPerTile, 64);
    _tile_dpbf16ps(0, 1, 2);
    _tile_dpbf16ps(3, 1, 4);
    _tile_dpbf16ps(5, 1, 7);
    _tile_loadd(2, b + 3 * kValuesPerTile, 64);
    _tile_dpbf16ps(6, 1, 2);
    _tile_stored(0, c, stride);
    _tile_stored(3, c + 16, stride);
    _tile_stored(5, c + 32, stride);
    _tile_stored(6, c + 48, stride);
  }
  for (; t < dv / 16; t += 2) {
    if (first) {
      _tile_zero(0);
      _tile_zero(3);
    } else {
      _tile_loadd(0, acc + 16 * t, stride);
      _tile_loadd(3, acc + 16 * (t + 1), stride);
    }
    _tile_loadd(2, vb + static_cast<int64_t>(t) * kValuesPerTile, 64);
    _tile_loadd(4, vb + static_cast<int64_t>(t + 1) * kValuesPerTile, 64);
    _tile_dpbf16ps(0, 1, 2);
    _tile_dpbf16ps(3, 1, 4);
    _tile_stored(0, acc + 16 * t, stride);
    _tile_stored(3, acc + 16 * (t + 1), stride);
  }
}

PAGODA_AMX_TARGET double peak_one_thread() {
  alignas(64) static uint16_t ones[kValuesPerTile];
  for (uint16_t& x : ones) x = 0x3F80;  // 1.0
  constexpr int64_t kIters = 1 << 18;
  TileScope tiles;
  _tile_zero(0);
  _tile_zero(1);
  _tile_zero(2);
  _tile_zero(3);
  _tile_loadd(4, ones, 64);
  _tile_loadd(5, ones, 64);
  const auto t0 = std::chrono::steady_clock::now();
  for (int64_t i = 0; i < kIters; ++i) {
    // Four accumulators: independent chains cover the multiply's latency.
    _tile_dpbf16ps(0, 4, 5);
    _tile_dpbf16ps(1, 4, 5);
    _tile_dpbf16ps(2, 4, 5);
    _tile_dpbf16ps(3, 4, 5);
  }
  alignas(64) float sink[kTileRows * kTileRows];
  _tile_stored(0, sink, 64);
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  volatile float keep = sink[0];
  (void)keep;
  constexpr double kFlopPerMultiply = 2.0 * kTileRows * kTileRows * 32;
  return kFlopPerMultiply * 4 * static_cast<double>(kIters) / s;
}

}  // namespace pagoda::cpu::amx
