#pragma once
// Helpers the units' sources (amx_tiles.cc, bf16_blocks.cc, bf16_dot.cc,
// fp8_tables.cc) inline: the AVX-512 target attribute, a 16 x 16 transpose of
// fp32 and the spreading of prefetch requests. Include after <immintrin.h>, in
// sources only.

#include <immintrin.h>

#include <algorithm>
#include <cstdint>

#include "cpu/bf16_blocks.h"
#include "cpu/decode_tiles.h"

// GCC 12's AVX-512 intrinsics start their results from _mm512_undefined_*(),
// which -Wuninitialized reports once inlined (GCC bug 105593, fixed in 13).
#if defined(__GNUC__) && !defined(__clang__) && __GNUC__ < 13
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif

#define PAGODA_BF16_TARGET __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512bf16")))

namespace pagoda::cpu::bf16 {

// 16 rows of 16 32-bit lanes transposed in registers: out[c][r] = rows[r][c].
// Data movement only: any bits, not only floats, come through unchanged.
PAGODA_BF16_TARGET inline void transpose16(const __m512 rows[16], __m512 out[16]) {
  __m512 a[16];
  __m512 b[16];
  for (int i = 0; i < 8; ++i) {
    a[2 * i] = _mm512_unpacklo_ps(rows[2 * i], rows[2 * i + 1]);
    a[2 * i + 1] = _mm512_unpackhi_ps(rows[2 * i], rows[2 * i + 1]);
  }
  // b[4i + c], 128-bit lane L: column 4L + c of rows 4i .. 4i + 3.
  for (int i = 0; i < 4; ++i) {
    const __m512d x0 = _mm512_castps_pd(a[4 * i]);
    const __m512d x1 = _mm512_castps_pd(a[4 * i + 1]);
    const __m512d x2 = _mm512_castps_pd(a[4 * i + 2]);
    const __m512d x3 = _mm512_castps_pd(a[4 * i + 3]);
    b[4 * i + 0] = _mm512_castpd_ps(_mm512_unpacklo_pd(x0, x2));
    b[4 * i + 1] = _mm512_castpd_ps(_mm512_unpackhi_pd(x0, x2));
    b[4 * i + 2] = _mm512_castpd_ps(_mm512_unpacklo_pd(x1, x3));
    b[4 * i + 3] = _mm512_castpd_ps(_mm512_unpackhi_pd(x1, x3));
  }
  // Column 4L + c gathers lane L of b[c], b[4 + c], b[8 + c], b[12 + c].
  for (int c = 0; c < 4; ++c) {
    const __m512 e0 = _mm512_shuffle_f32x4(b[c], b[4 + c], 0x88);
    const __m512 e1 = _mm512_shuffle_f32x4(b[c], b[4 + c], 0xDD);
    const __m512 f0 = _mm512_shuffle_f32x4(b[8 + c], b[12 + c], 0x88);
    const __m512 f1 = _mm512_shuffle_f32x4(b[8 + c], b[12 + c], 0xDD);
    out[c] = _mm512_shuffle_f32x4(e0, f0, 0x88);
    out[8 + c] = _mm512_shuffle_f32x4(e0, f0, 0xDD);
    out[4 + c] = _mm512_shuffle_f32x4(e1, f1, 0x88);
    out[12 + c] = _mm512_shuffle_f32x4(e1, f1, 0xDD);
  }
}

// rows[0..16) (16 floats each, 64-byte aligned) transposed in registers:
// out[c][r] = in[r][c].
PAGODA_BF16_TARGET inline void transpose16(const float* in, __m512 out[16]) {
  __m512 rows[16];
  for (int r = 0; r < 16; ++r) rows[r] = _mm512_load_ps(in + 16 * r);
  transpose16(rows, out);
}

// P.V reading V where it lies ticks its requests every this many pairs of
// keys. Once per step of chunks (two ticks a 32-key group at head_dim 128)
// sent the next group's lines in bursts of half of them. AMD Zen 5, GQA 4
// with one query row, medians of paired runs: e4m3 at 8 x 4096 tokens on 2
// threads 0.91-0.97x the time (a tick every pair 0.94x, every 4 pairs 0.95x),
// 0.93x on one thread from memory; bf16 0.92x, head_dim 64 0.95x;
// cache-resident level.
inline constexpr int kPairsPerRequestTick = 2;
// The ticks of one such pass over a 32-key group.
inline constexpr int kRequestTicksPerPvGroup = kPvKeys / 2 / kPairsPerRequestTick;

// Issues `requests` in `steps` near-equal parts, one per tick().
class Spread {
 public:
  Spread(Requests r, int64_t steps) : r_(r), per_(r.prefetch ? (r.lines + steps - 1) / steps : 0) {}
  // Inlined into the units' loops: out of line it took 4% of a 16-row bf16 decode.
  [[gnu::always_inline]] void tick() {
    if (per_ == 0 || r_.lines <= 0) return;
    const int64_t n = std::min(per_, r_.lines);
    r_.prefetch->step(n);
    r_.lines -= n;
  }

 private:
  Requests r_;
  int64_t per_;
};

}  // namespace pagoda::cpu::bf16
