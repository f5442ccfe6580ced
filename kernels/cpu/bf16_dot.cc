// AVX512-BF16 dot products of the CPU kernel's bf16 path (bf16_dot.h).
#include "cpu/bf16_dot.h"

#include <immintrin.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <type_traits>

#include "cpu/bf16_blocks_inl.h"

namespace pagoda::cpu::bf16dot {
namespace {

using bf16::kPairsPerRequestTick;
using bf16::kRequestTicksPerPvGroup;
using bf16::kPvKeys;
using bf16::kTileRows;
using bf16::kValuesPerTile;
using bf16::PLayout;
using bf16::Spread;

// The 32-bit word (a pair of bf16 values) at p, for a broadcast.
inline int32_t pair_at(const void* p) {
  int32_t w;
  std::memcpy(&w, p, sizeof(w));
  return w;
}

// Calls fn(std::integral_constant<int64_t, kStride>()) with the byte stride of
// key rows known at compile time where every group's rows are packed (2 d
// bytes, the head dims of the vocabulary): each key's words are then one
// displacement off a single pointer, the row addresses taking no registers;
// else kStride = 0, the groups' own strides read at run time.
template <class Fn>
PAGODA_BF16_TARGET inline void with_key_stride(int32_t d, const KeyRows* keys, int32_t groups, const Fn& fn) {
  bool packed = true;
  for (int32_t g = 0; g < groups; ++g) packed = packed && keys[g].stride == 2 * static_cast<int64_t>(d);
  if (packed) {
    switch (d) {
      case 64: return fn(std::integral_constant<int64_t, 128>());
      case 128: return fn(std::integral_constant<int64_t, 256>());
      case 256: return fn(std::integral_constant<int64_t, 512>());
      case 576: return fn(std::integral_constant<int64_t, 1152>());
      default: break;
    }
  }
  fn(std::integral_constant<int64_t, 0>());
}

// Line-request ticks per group of 16 keys for each score form (the callers
// add one after the group): the quads and the packed pairs tick every
// kQuadTickPairs pairs, the transposed form every kTransposedTickPairs pairs
// of each of its blocks (every 16 sent bursts of a quarter of the keys' lines:
// bf16 GQA 4 with four query rows, 8 x 4096 tokens, AMD Zen 5: 0.96x the time
// on 2 threads, 0.95x on one; GQA 8 and cache-resident level).
constexpr int32_t kQuadTickPairs = 16;
constexpr int32_t kTransposedTickPairs = 4;
constexpr int32_t quad_ticks(int32_t d) { return d / 2 / kQuadTickPairs; }
constexpr int32_t transposed_ticks(int32_t d) { return d / 2 / kTransposedTickPairs; }

// Scores of 9 to 16 rows, the rows in the lanes of 512-bit vectors, for
// kBlocks blocks of 16 rows against the same keys: st[b][j][r] = scale *
// (q_b[r] . key j) for the first n keys of `keys`. One block takes its 16
// keys at once, 16 independent chains covering VDPBF16PS's latency; two
// blocks (32 rows: GQA 8 with four query rows, latent attention's 32 heads)
// take eight keys at a time, each key's broadcast pair feeding both blocks'
// q: one load for two dot products where one block spends one on each (a
// score loop on keys in L1 on AMD Zen 5: 7.3 against 6.65 G dot products a
// second, the unit's peak about 7.1). Each score is the same chain, pair
// after pair, either way (the same bits). kStride as with_key_stride gives it.
template <int kBlocks, int64_t kStride>
PAGODA_BF16_TARGET inline void scores_transposed(const uint16_t* const* qb, int32_t d, const KeyRows& keys,
                                                __m512 scale, int32_t n, float* const* st, Spread& spread) {
  constexpr int kKeys = kTileRows / kBlocks;
  // transposed_ticks(d) over all the passes.
  constexpr int32_t kTickPairs = kTransposedTickPairs * kBlocks;
  const int64_t stride = kStride > 0 ? kStride : keys.stride;
  for (int h = 0; h < kBlocks; ++h) {
    const auto* k = reinterpret_cast<const char*>(keys.k) + h * kKeys * stride;
    __m512 acc[kBlocks][kKeys];
    for (auto& block : acc)
      for (auto& a : block) a = _mm512_setzero_ps();
    for (int32_t p = 0; p < d / 2; ++p, k += 4) {
      // One load of each block's q pair serves the keys (hoisted out of the loop).
      __m512bh q[kBlocks];
      for (int b = 0; b < kBlocks; ++b) q[b] = reinterpret_cast<__m512bh>(_mm512_loadu_si512(qb[b] + 32 * p));
      for (int j = 0; j < kKeys; ++j) {
        const __m512bh key = reinterpret_cast<__m512bh>(_mm512_set1_epi32(pair_at(k + j * stride)));
        for (int b = 0; b < kBlocks; ++b) acc[b][j] = _mm512_dpbf16_ps(acc[b][j], q[b], key);
      }
      if (p % kTickPairs == kTickPairs - 1) spread.tick();
    }
    for (int j = 0; j < kKeys && h * kKeys + j < n; ++j) {
      for (int b = 0; b < kBlocks; ++b) {
        _mm512_storeu_ps(st[b] + kTileRows * (h * kKeys + j), _mm512_mul_ps(acc[b][j], scale));
      }
    }
  }
}

// Up to 8 rows with keys in the lanes as well: a 128-bit lane per key, the
// four rows of a quad in its four words. One 512-bit VDPBF16PS then serves 4
// keys x 4 rows, where the rows-in-lanes form's serves one key and, below 9
// rows, leaves half its lanes idle: a quarter of the instructions at 4 rows.
// Key G + 4L of a group sits in lane L of accumulator G: its 16 bytes at
// pair p (pairs p .. p + 3) are inserted there and each pair spread over the
// lane in turn, so every score is the same chain, pair after pair, as in the
// rows-in-lanes form (the same bits), and a 4 x 4 transpose inside the lanes
// leaves row s of the quad with its 16 scores in key order. kStride as
// with_key_stride gives it.
template <int kQuads, int kGroups, int64_t kStride>
PAGODA_BF16_TARGET inline void scores_by_quads(const uint16_t* qb, int32_t d, const KeyRows* keys, int32_t rows,
                                               __m512 scale, float* out, int64_t out_stride, Spread& spread) {
  const char* k[kGroups];
  int64_t stride[kGroups];
  for (int g = 0; g < kGroups; ++g) {
    k[g] = reinterpret_cast<const char*>(keys[g].k);
    stride[g] = kStride > 0 ? kStride : keys[g].stride;
  }
  __m512 acc[kGroups][kQuads][4];
  for (auto& group : acc)
    for (auto& quad : group)
      for (auto& a : quad) a = _mm512_setzero_ps();
  for (int32_t p = 0; p < d / 2; p += 4) {
    // Pair p + i of the quad's four rows, in every lane.
    __m512bh qv[kQuads][4];
    for (int qd = 0; qd < kQuads; ++qd) {
      for (int i = 0; i < 4; ++i) {
        const auto* q = reinterpret_cast<const __m128i*>(qb + 32 * (p + i) + 8 * qd);
        qv[qd][i] = reinterpret_cast<__m512bh>(_mm512_broadcast_i32x4(_mm_loadu_si128(q)));
      }
    }
    for (int g = 0; g < kGroups; ++g) {
      const char* at = k[g] + 4 * static_cast<int64_t>(p);
      for (int G = 0; G < 4; ++G) {
        const char* key = at + G * stride[g];
        const int64_t four = 4 * stride[g];
        __m512i kv = _mm512_castsi128_si512(_mm_loadu_si128(reinterpret_cast<const __m128i*>(key)));
        kv = _mm512_inserti32x4(kv, _mm_loadu_si128(reinterpret_cast<const __m128i*>(key + four)), 1);
        kv = _mm512_inserti32x4(kv, _mm_loadu_si128(reinterpret_cast<const __m128i*>(key + 2 * four)), 2);
        kv = _mm512_inserti32x4(kv, _mm_loadu_si128(reinterpret_cast<const __m128i*>(key + 3 * four)), 3);
        const __m512i pair[4] = {_mm512_shuffle_epi32(kv, _MM_PERM_AAAA), _mm512_shuffle_epi32(kv, _MM_PERM_BBBB),
                                 _mm512_shuffle_epi32(kv, _MM_PERM_CCCC), _mm512_shuffle_epi32(kv, _MM_PERM_DDDD)};
        for (int i = 0; i < 4; ++i) {
          for (int qd = 0; qd < kQuads; ++qd) {
            acc[g][qd][G] = _mm512_dpbf16_ps(acc[g][qd][G], qv[qd][i], reinterpret_cast<__m512bh>(pair[i]));
          }
        }
      }
    }
    if (p % kQuadTickPairs == kQuadTickPairs - 4) {  // the last step of 4 pairs of kQuadTickPairs
      for (int g = 0; g < kGroups; ++g) spread.tick();
    }
  }
  for (int g = 0; g < kGroups; ++g) {
    const __mmask16 live = static_cast<__mmask16>((1u << keys[g].n) - 1);
    for (int qd = 0; qd < kQuads; ++qd) {
      const __m512* a = acc[g][qd];
      const __m512 t0 = _mm512_unpacklo_ps(a[0], a[1]);
      const __m512 t1 = _mm512_unpackhi_ps(a[0], a[1]);
      const __m512 t2 = _mm512_unpacklo_ps(a[2], a[3]);
      const __m512 t3 = _mm512_unpackhi_ps(a[2], a[3]);
      const __m512d u0 = _mm512_castps_pd(t0);
      const __m512d u1 = _mm512_castps_pd(t1);
      const __m512d u2 = _mm512_castps_pd(t2);
      const __m512d u3 = _mm512_castps_pd(t3);
      const __m512 row_scores[4] = {
          _mm512_castpd_ps(_mm512_unpacklo_pd(u0, u2)), _mm512_castpd_ps(_mm512_unpackhi_pd(u0, u2)),
          _mm512_castpd_ps(_mm512_unpacklo_pd(u1, u3)), _mm512_castpd_ps(_mm512_unpackhi_pd(u1, u3))};
      for (int s = 0; s < 4 && 4 * qd + s < rows; ++s) {
        _mm512_mask_storeu_ps(out + (4 * qd + s) * out_stride + g * kTileRows, live,
                              _mm512_mul_ps(row_scores[s], scale));
      }
    }
    spread.tick();
  }
}

// Scores from keys packed pair by pair (fp8tab::pack_k): pair p of a group's
// 16 keys is one vector, loaded once for the rows, each row's q pair a 32-bit
// broadcast from packed q; acc[r][g] holds row r's scores of group g's keys
// in key order, so there is no transpose. kRows rows are computed (packed q's
// padding rows are zero), the first `rows` stored.
template <int kRows, int kGroups>
PAGODA_BF16_TARGET inline void scores_pairs(const uint16_t* qb, int32_t d, const KeyRows* keys, int32_t rows,
                                            __m512 scale, float* out, int64_t out_stride, Spread& spread) {
  __m512 acc[kRows][kGroups];
  for (auto& row : acc)
    for (auto& a : row) a = _mm512_setzero_ps();
  for (int32_t p0 = 0; p0 < d / 2; p0 += kQuadTickPairs) {
    for (int32_t p = p0; p < p0 + kQuadTickPairs; ++p) {
      for (int g = 0; g < kGroups; ++g) {
        const __m512bh k = reinterpret_cast<__m512bh>(_mm512_loadu_si512(keys[g].k + 32 * p));
        for (int r = 0; r < kRows; ++r) {
          const __m512bh q = reinterpret_cast<__m512bh>(_mm512_set1_epi32(pair_at(qb + 32 * p + 2 * r)));
          acc[r][g] = _mm512_dpbf16_ps(acc[r][g], k, q);
        }
      }
    }
    for (int g = 0; g < kGroups; ++g) spread.tick();
  }
  for (int g = 0; g < kGroups; ++g) {
    const __mmask16 live = static_cast<__mmask16>((1u << keys[g].n) - 1);
    for (int32_t r = 0; r < rows; ++r) {
      _mm512_mask_storeu_ps(out + r * out_stride + g * kTileRows, live, _mm512_mul_ps(acc[r][g], scale));
    }
  }
}

// Where the pair of weights (row r, keys 2k and 2k + 1) sits in a packed P.
template <PLayout kLayout>
constexpr int64_t p_pair_offset(int r, int k) {
  return kLayout == PLayout::kRowMajor ? r * kPvKeys + 2 * k : k * kPvKeys + 2 * r;
}

// kRows rows of P.V over kVecs stretches of 16 output elements at a time:
// kRows x kVecs accumulators, each packed V vector loaded once for the rows,
// each row's pair of weights broadcast once for the stretches. One tick of
// `spread` after each step of kVecs stretches.
template <int kRows, int kVecs, PLayout kLayout>
PAGODA_BF16_TARGET inline void accumulate_rows(const uint16_t* pa, const uint16_t* vb, int32_t dv, float* acc,
                                               int64_t acc_stride, bool first, Spread& spread) {
  for (int32_t t0 = 0; t0 < dv / 16; t0 += kVecs) {
    __m512 c[kRows][kVecs];
    for (int r = 0; r < kRows; ++r) {
      for (int i = 0; i < kVecs; ++i) {
        c[r][i] = first ? _mm512_setzero_ps() : _mm512_loadu_ps(acc + r * acc_stride + 16 * (t0 + i));
      }
    }
    for (int k = 0; k < kPvKeys / 2; ++k) {
      __m512bh w[kRows];
      for (int r = 0; r < kRows; ++r) {
        w[r] = reinterpret_cast<__m512bh>(_mm512_set1_epi32(pair_at(pa + p_pair_offset<kLayout>(r, k))));
      }
      for (int i = 0; i < kVecs; ++i) {
        const __m512bh v = reinterpret_cast<__m512bh>(
            _mm512_loadu_si512(vb + static_cast<int64_t>(t0 + i) * kValuesPerTile + 32 * k));
        for (int r = 0; r < kRows; ++r) c[r][i] = _mm512_dpbf16_ps(c[r][i], v, w[r]);
      }
    }
    for (int r = 0; r < kRows; ++r) {
      for (int i = 0; i < kVecs; ++i) _mm512_storeu_ps(acc + r * acc_stride + 16 * (t0 + i), c[r][i]);
    }
    spread.tick();
  }
}

template <int kVecs, PLayout kLayout>
PAGODA_BF16_TARGET void accumulate_all(const uint16_t* pa, const uint16_t* vb, int32_t dv, float* acc,
                                       int64_t acc_stride, int32_t rows, bool first, Requests requests) {
  // The first of the rows r0.. in pa (pair-major: two bf16 values a row).
  const auto rows_from = [&](int32_t r0) { return pa + p_pair_offset<kLayout>(r0, 0); };
  // Rows in fours where they come in fours (a GQA-4 group per query token):
  // 4 x kVecs / 2 accumulators, each packed V vector loaded once for the four,
  // where three and one loaded it twice (AMD Zen 5, 2 threads, 8 x 4096
  // tokens, GQA 4: 0.96-0.98x the time with one query row, 0.95-0.97x with four).
  if (rows % 4 == 0 && kVecs % 2 == 0) {
    constexpr int kFourVecs = kVecs / 2;
    Spread spread(requests, rows / 4 * (dv / 16 / kFourVecs));
    for (int32_t r = 0; r < rows; r += 4) {
      accumulate_rows<4, kFourVecs, kLayout>(rows_from(r), vb, dv, acc + r * acc_stride, acc_stride, first, spread);
    }
    return;
  }
  // Else three rows of eight stretches: 24 accumulators, 8 operands beside them.
  Spread spread(requests, (rows + 2) / 3 * (dv / 16 / kVecs));
  int32_t r = 0;
  for (; r + 3 <= rows; r += 3) {
    accumulate_rows<3, kVecs, kLayout>(rows_from(r), vb, dv, acc + r * acc_stride, acc_stride, first, spread);
  }
  if (rows - r == 2) {
    accumulate_rows<2, kVecs, kLayout>(rows_from(r), vb, dv, acc + r * acc_stride, acc_stride, first, spread);
  }
  if (rows - r == 1) {
    accumulate_rows<1, kVecs, kLayout>(rows_from(r), vb, dv, acc + r * acc_stride, acc_stride, first, spread);
  }
}

// The bf16 zeros that stand for a missing V row.
alignas(64) constexpr uint16_t kZeroRow[576] = {};

// kRows rows of P.V over kChunks chunks of 32 elements at a time, V from its
// rows: per pair of keys and chunk, two loads and two interleaves give the
// two packed vectors (the low and high halves of the chunk in lane order),
// each used by the kRows rows against their broadcast weights: 2 kRows
// kChunks accumulators.
template <int kRows, int kChunks>
PAGODA_BF16_TARGET inline void accumulate_in_place_rows(const uint16_t* pa, const uint16_t* const* v, int32_t dv,
                                                        float* acc, int64_t acc_stride, bool first, Spread& spread) {
  for (int32_t c0 = 0; c0 < dv / 32; c0 += kChunks) {
    __m512 lo[kRows][kChunks];
    __m512 hi[kRows][kChunks];
    for (int r = 0; r < kRows; ++r) {
      for (int c = 0; c < kChunks; ++c) {
        const float* a = acc + r * acc_stride + 32 * (c0 + c);
        lo[r][c] = first ? _mm512_setzero_ps() : _mm512_loadu_ps(a);
        hi[r][c] = first ? _mm512_setzero_ps() : _mm512_loadu_ps(a + 16);
      }
    }
    for (int k = 0; k < kPvKeys / 2; ++k) {
      __m512bh vlo[kChunks];
      __m512bh vhi[kChunks];
      for (int c = 0; c < kChunks; ++c) {
        const __m512i x0 = _mm512_loadu_si512(v[2 * k] + 32 * (c0 + c));
        const __m512i x1 = _mm512_loadu_si512(v[2 * k + 1] + 32 * (c0 + c));
        vlo[c] = reinterpret_cast<__m512bh>(_mm512_unpacklo_epi16(x0, x1));
        vhi[c] = reinterpret_cast<__m512bh>(_mm512_unpackhi_epi16(x0, x1));
      }
      for (int r = 0; r < kRows; ++r) {
        const __m512bh w = reinterpret_cast<__m512bh>(_mm512_set1_epi32(pair_at(pa + r * kPvKeys + 2 * k)));
        for (int c = 0; c < kChunks; ++c) {
          lo[r][c] = _mm512_dpbf16_ps(lo[r][c], vlo[c], w);
          hi[r][c] = _mm512_dpbf16_ps(hi[r][c], vhi[c], w);
        }
      }
      if (k % kPairsPerRequestTick == kPairsPerRequestTick - 1) spread.tick();
    }
    for (int r = 0; r < kRows; ++r) {
      for (int c = 0; c < kChunks; ++c) {
        float* a = acc + r * acc_stride + 32 * (c0 + c);
        _mm512_storeu_ps(a, lo[r][c]);
        _mm512_storeu_ps(a + 16, hi[r][c]);
      }
    }
  }
}

// Up to 4 rows: as many chunks at a time as keep 8 to 16 accumulators (two
// FMA ports of latency 6 need 12) where the chunks divide dv / 32.
// `requests` are spread over the pairs of keys of every step of chunks.
template <int kRows>
PAGODA_BF16_TARGET inline void accumulate_in_place_block(const uint16_t* pa, const uint16_t* const* v, int32_t dv,
                                                         float* acc, int64_t acc_stride, bool first,
                                                         Requests requests) {
  constexpr int kWide = kRows <= 2 ? 4 : 2;
  if ((dv / 32) % kWide == 0) {
    Spread spread(requests, dv / 32 / kWide * kRequestTicksPerPvGroup);
    return accumulate_in_place_rows<kRows, kWide>(pa, v, dv, acc, acc_stride, first, spread);
  }
  Spread spread(requests, dv / 32 * kRequestTicksPerPvGroup);
  accumulate_in_place_rows<kRows, 1>(pa, v, dv, acc, acc_stride, first, spread);
}

}  // namespace

bool available() {
  static const bool yes = bf16::cpu_has_avx512_bf16();
  return yes;
}

PAGODA_BF16_TARGET void scores(const uint16_t* qb, int32_t d, const KeyRows* keys, int32_t groups, int32_t rows,
                               float scale, float* out, int64_t out_stride, Requests requests) {
  Spread spread(requests, groups * ((rows <= 8 ? quad_ticks(d) : transposed_ticks(d)) + 1));
  const __m512 vs = _mm512_set1_ps(scale);
  if (rows <= 8) {
    return with_key_stride(d, keys, groups, [&](auto stride) PAGODA_BF16_TARGET {
      constexpr int64_t kStride = decltype(stride)::value;
      const auto by_quads = [&](auto quads) PAGODA_BF16_TARGET {
        constexpr int kQuads = decltype(quads)::value;
        if (groups == 2) return scores_by_quads<kQuads, 2, kStride>(qb, d, keys, rows, vs, out, out_stride, spread);
        scores_by_quads<kQuads, 1, kStride>(qb, d, keys, rows, vs, out, out_stride, spread);
      };
      if (rows <= 4) return by_quads(std::integral_constant<int, 1>());
      by_quads(std::integral_constant<int, 2>());
    });
  }
  alignas(64) float st[kTileRows * kTileRows];  // [key][row]
  for (int32_t gi = 0; gi < groups; ++gi) {
    with_key_stride(d, keys + gi, 1, [&](auto stride) PAGODA_BF16_TARGET {
      float* const into[1] = {st};
      scores_transposed<1, decltype(stride)::value>(&qb, d, keys[gi], vs, kTileRows, into, spread);
    });
    __m512 s[kTileRows];
    bf16::transpose16(st, s);
    const __mmask16 live = static_cast<__mmask16>((1u << keys[gi].n) - 1);
    float* o = out + gi * kTileRows;
    for (int32_t r = 0; r < rows; ++r) _mm512_mask_storeu_ps(o + r * out_stride, live, s[r]);
    spread.tick();
  }
}

PAGODA_BF16_TARGET void scores_by_key(const uint16_t* qb, int32_t d, const KeyRows* keys, int32_t groups,
                                      float scale, float* out, Requests requests, const uint16_t* qb2, float* out2) {
  Spread spread(requests, groups * (transposed_ticks(d) + 1));
  const __m512 vs = _mm512_set1_ps(scale);
  for (int32_t gi = 0; gi < groups; ++gi) {
    const uint16_t* const q[2] = {qb, qb2};
    float* const o[2] = {out + gi * kTileRows * kTileRows, qb2 ? out2 + gi * kTileRows * kTileRows : nullptr};
    with_key_stride(d, keys + gi, 1, [&](auto stride) PAGODA_BF16_TARGET {
      constexpr int64_t kStride = decltype(stride)::value;
      if (qb2 != nullptr) return scores_transposed<2, kStride>(q, d, keys[gi], vs, keys[gi].n, o, spread);
      scores_transposed<1, kStride>(q, d, keys[gi], vs, keys[gi].n, o, spread);
    });
    spread.tick();
  }
}

PAGODA_BF16_TARGET void scores_packed(const uint16_t* qb, int32_t d, const KeyRows* keys, int32_t groups,
                                      int32_t rows, float scale, float* out, int64_t out_stride, Requests requests) {
  Spread spread(requests, groups * quad_ticks(d));
  const __m512 vs = _mm512_set1_ps(scale);
  const auto for_rows = [&](auto row_count) PAGODA_BF16_TARGET {
    constexpr int kRows = decltype(row_count)::value;
    if (kRows <= 8 && groups == 2) return scores_pairs<kRows, 2>(qb, d, keys, rows, vs, out, out_stride, spread);
    for (int32_t g = 0; g < groups; ++g) {
      scores_pairs<kRows, 1>(qb, d, keys + g, rows, vs, out + g * kTileRows, out_stride, spread);
    }
  };
  if (rows <= 4) return for_rows(std::integral_constant<int, 4>());
  if (rows <= 8) return for_rows(std::integral_constant<int, 8>());
  for_rows(std::integral_constant<int, 16>());
}

PAGODA_BF16_TARGET void accumulate(const uint16_t* pa, const uint16_t* vb, int32_t dv, float* acc,
                                   int64_t acc_stride, int32_t rows, bool first, PLayout layout, Requests requests) {
  // dv is a multiple of 64 in the vocabulary: whole steps of 4 or 8 stretches.
  const bool eight = (dv / 16) % 8 == 0;
  if (layout == PLayout::kPairMajor) {
    if (eight) return accumulate_all<8, PLayout::kPairMajor>(pa, vb, dv, acc, acc_stride, rows, first, requests);
    return accumulate_all<4, PLayout::kPairMajor>(pa, vb, dv, acc, acc_stride, rows, first, requests);
  }
  if (eight) return accumulate_all<8, PLayout::kRowMajor>(pa, vb, dv, acc, acc_stride, rows, first, requests);
  accumulate_all<4, PLayout::kRowMajor>(pa, vb, dv, acc, acc_stride, rows, first, requests);
}

PAGODA_BF16_TARGET void accumulate_in_place(const uint16_t* pa, const uint16_t* const* v, int32_t dv, float* acc,
                                            int64_t acc_stride, int32_t rows, bool first, Requests requests) {
  const uint16_t* rows_of_v[kPvKeys];
  for (int j = 0; j < kPvKeys; ++j) rows_of_v[j] = v[j] != nullptr ? v[j] : kZeroRow;
  switch (rows) {
    case 1: return accumulate_in_place_block<1>(pa, rows_of_v, dv, acc, acc_stride, first, requests);
    case 2: return accumulate_in_place_block<2>(pa, rows_of_v, dv, acc, acc_stride, first, requests);
    case 3: return accumulate_in_place_block<3>(pa, rows_of_v, dv, acc, acc_stride, first, requests);
    default: return accumulate_in_place_block<4>(pa, rows_of_v, dv, acc, acc_stride, first, requests);
  }
}

PAGODA_BF16_TARGET void lanes_to_elements(float* acc, int64_t acc_stride, int32_t rows, int32_t dv) {
  // 128-bit blocks: (lo0, hi0, lo1, hi1) and (lo2, hi2, lo3, hi3), as float indices
  // (16 + i: lane i of the second operand).
  const __m512i first = _mm512_setr_epi32(0, 1, 2, 3, 16, 17, 18, 19, 4, 5, 6, 7, 20, 21, 22, 23);
  const __m512i second = _mm512_setr_epi32(8, 9, 10, 11, 24, 25, 26, 27, 12, 13, 14, 15, 28, 29, 30, 31);
  for (int32_t r = 0; r < rows; ++r) {
    float* a = acc + r * acc_stride;
    for (int32_t c = 0; c < dv; c += 32) {
      const __m512 lo = _mm512_loadu_ps(a + c);
      const __m512 hi = _mm512_loadu_ps(a + c + 16);
      _mm512_storeu_ps(a + c, _mm512_permutex2var_ps(lo, first, hi));
      _mm512_storeu_ps(a + c + 16, _mm512_permutex2var_ps(lo, second, hi));
    }
  }
}

PAGODA_BF16_TARGET double peak_one_thread() {
  // Independent chains, at least latency x issue rate: Zen 5 needs 16 (12
  // measured 6.55 against 7.1 G instructions/s on one thread).
  constexpr int kChains = 16;
  constexpr int64_t kIters = 1 << 22;
  __m512 a[kChains];
  for (int i = 0; i < kChains; ++i) a[i] = _mm512_set1_ps(static_cast<float>(i));
  const __m512bh x = reinterpret_cast<__m512bh>(_mm512_set1_epi32(0x3F803F80));  // (1, 1)
  __m512bh y = x;  // each chain grows by 2 a step: 2^23 at the end, finite and exact
  const auto t0 = std::chrono::steady_clock::now();
  for (int64_t it = 0; it < kIters; ++it) {
    for (int i = 0; i < kChains; ++i) a[i] = _mm512_dpbf16_ps(a[i], x, y);
    asm volatile("" : "+v"(y));  // keeps the loop from being folded
  }
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  __m512 sum = a[0];
  for (int i = 1; i < kChains; ++i) sum = _mm512_add_ps(sum, a[i]);
  volatile float sink = _mm512_reduce_add_ps(sum);
  (void)sink;
  constexpr double kFlopPerOp = 2.0 * 32;  // 16 lanes x 2 multiply-adds
  return kFlopPerOp * kChains * static_cast<double>(kIters) / s;
}

}  // namespace pagoda::cpu::bf16dot
