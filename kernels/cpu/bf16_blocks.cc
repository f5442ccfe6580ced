// Packing of the bf16 operands both matrix units read (bf16_blocks.h).
#include <cpuid.h>
#include <immintrin.h>

#include <cstring>

#include "cpu/bf16_blocks_inl.h"

namespace pagoda::cpu::bf16 {

bool cpu_has_avx512_bf16() {
  unsigned a = 0, b = 0, c = 0, d = 0;
  if (__get_cpuid_count(7, 1, &a, &b, &c, &d) == 0) return false;
  const bool avx512_bf16 = (a & (1u << 5)) != 0;
  return avx512_bf16 && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
         __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq");
}

PAGODA_BF16_TARGET void pack_q(const float* const* q, int32_t d, uint16_t* qb) {
  // Row r's q as bf16 pairs (one 32-bit word per pair), word k of every row
  // side by side: tile c, row k holds pair 16c + k of rows 0..15. Each 16
  // pairs of the 16 rows are a 16 x 16 block of words, transposed in
  // registers: copied a word at a time through a stack array, the packing
  // (once per task) took 1.7% of an e4m3 GQA 4 decode's kernel profile, 0.9%
  // so (AMD Zen 5, one thread, 2048 tokens).
  auto* out = reinterpret_cast<float*>(qb);
  for (int32_t e = 0; e < d; e += 32) {
    __m512 rows[kTileRows];
    for (int r = 0; r < kTileRows; ++r) {
      rows[r] = q[r] ? reinterpret_cast<__m512>(_mm512_cvtne2ps_pbh(_mm512_loadu_ps(q[r] + e + 16),
                                                                    _mm512_loadu_ps(q[r] + e)))
                     : _mm512_setzero_ps();
    }
    __m512 pairs[kTileRows];
    transpose16(rows, pairs);
    for (int k = 0; k < kTileRows; ++k) _mm512_storeu_ps(out + (e / 2 + k) * kTileRows, pairs[k]);
  }
}

PAGODA_BF16_TARGET void pack_k(const uint16_t* k, int64_t stride, int32_t n, int32_t d, uint16_t* kb) {
  // Each 16 pairs (64 bytes) of the 16 keys are a 16 x 16 block of 32-bit
  // words: transposed, pair p of every key is one vector.
  const auto* base = reinterpret_cast<const char*>(k);
  for (int32_t c = 0; c < d / 32; ++c) {
    __m512 rows[kTileRows];
    for (int j = 0; j < kTileRows; ++j) {
      rows[j] = j < n ? _mm512_loadu_ps(reinterpret_cast<const float*>(base + j * stride) + 16 * c)
                      : _mm512_setzero_ps();
    }
    __m512 pairs[kTileRows];
    transpose16(rows, pairs);
    auto* out = reinterpret_cast<float*>(kb) + 16 * 16 * c;
    for (int i = 0; i < kTileRows; ++i) _mm512_storeu_ps(out + 16 * i, pairs[i]);
  }
}

PAGODA_BF16_TARGET void pack_v(const uint16_t* const* v, int32_t dv, uint16_t* vb, Requests requests) {
  Spread spread(requests, kPvKeys / 2);
  // 64-bit lanes of (unpacklo, unpackhi) that hold elements 0..15 and 16..31 of a
  // 32-element stretch, in order, as pairs.
  const __m512i first = _mm512_setr_epi64(0, 1, 8, 9, 2, 3, 10, 11);
  const __m512i second = _mm512_setr_epi64(4, 5, 12, 13, 6, 7, 14, 15);
  for (int k = 0; k < kPvKeys / 2; ++k) {
    const uint16_t* v0 = v[2 * k];
    const uint16_t* v1 = v[2 * k + 1];
    for (int32_t c = 0; c < dv / 32; ++c) {
      const __m512i x0 = v0 ? _mm512_loadu_si512(v0 + 32 * c) : _mm512_setzero_si512();
      const __m512i x1 = v1 ? _mm512_loadu_si512(v1 + 32 * c) : _mm512_setzero_si512();
      const __m512i lo = _mm512_unpacklo_epi16(x0, x1);
      const __m512i hi = _mm512_unpackhi_epi16(x0, x1);
      uint16_t* t0 = vb + static_cast<int64_t>(2 * c) * kValuesPerTile + k * 32;
      _mm512_storeu_si512(t0, _mm512_permutex2var_epi64(lo, first, hi));
      _mm512_storeu_si512(t0 + kValuesPerTile, _mm512_permutex2var_epi64(lo, second, hi));
    }
    spread.tick();
  }
}

PAGODA_BF16_TARGET void pack_p(const float* const* p, const int32_t* begin, const int32_t* end, int32_t rows,
                              uint16_t* pa) {
  for (int32_t r = 0; r < kTileRows; ++r) {
    uint16_t* row = pa + r * kPvKeys;
    if (r >= rows || begin[r] >= end[r]) {
      _mm512_storeu_si512(row, _mm512_setzero_si512());
      continue;
    }
    const uint32_t below_end = end[r] >= 32 ? ~0u : (1u << end[r]) - 1;
    const uint32_t live = below_end & ~((1u << begin[r]) - 1);
    const __m512 lo = _mm512_maskz_loadu_ps(static_cast<__mmask16>(live), p[r]);
    const __m512 hi = _mm512_maskz_loadu_ps(static_cast<__mmask16>(live >> 16), p[r] + 16);
    const __m512bh bf = _mm512_cvtne2ps_pbh(hi, lo);
    std::memcpy(row, &bf, sizeof(bf));
  }
}

PAGODA_BF16_TARGET void pack_p_pairs(const float* p, int32_t first_pair, int32_t end_pair, uint16_t* pa) {
  // cvtne2ps puts the first key's 16 rows in the low words and the second's in
  // the high ones; the permute pairs them row by row.
  alignas(64) static constexpr uint16_t kPairs[32] = {0,  16, 1,  17, 2,  18, 3,  19, 4,  20, 5,
                                                      21, 6,  22, 7,  23, 8,  24, 9,  25, 10, 26,
                                                      11, 27, 12, 28, 13, 29, 14, 30, 15, 31};
  const __m512i pairs = _mm512_load_si512(kPairs);
  for (int32_t k = 0; k < kPvKeys / 2; ++k) {
    __m512i words = _mm512_setzero_si512();
    if (k >= first_pair && k < end_pair) {
      const __m512bh bf = _mm512_cvtne2ps_pbh(_mm512_loadu_ps(p + 32 * k + 16), _mm512_loadu_ps(p + 32 * k));
      words = _mm512_permutexvar_epi16(pairs, reinterpret_cast<__m512i>(bf));
    }
    _mm512_storeu_si512(pa + 32 * k, words);
  }
}

}  // namespace pagoda::cpu::bf16
