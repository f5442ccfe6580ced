// AVX-512's scores for groups of 8 query heads and wider: four rows a vector,
// each key read once for four row blocks.
//
// Part of the CPU kernel's per-target code: decode_cpu.cc includes it after
// Highway's foreach_target, once per SIMD target (hence the toggled guard).

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include <hwy/highway.h>

#include "cpu/decode_blocking_inl.h"
#include "cpu/decode_cpu.h"
#include "cpu/decode_reads_inl.h"
#include "cpu/decode_tiles.h"

#if defined(PAGODA_CPU_DECODE_QUADS_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef PAGODA_CPU_DECODE_QUADS_INL_H_
#undef PAGODA_CPU_DECODE_QUADS_INL_H_
#else
#define PAGODA_CPU_DECODE_QUADS_INL_H_
#endif

HWY_BEFORE_NAMESPACE();
namespace pagoda::cpu::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// On AVX-512, from GQA 8 up, a vector holds four rows x four consecutive
// elements of head_dim (lane 4r + s: row r, element 4v + s of step v): q
// packed once per task, each step's four key elements replicated into every
// 128-bit block by the load (a broadcast; for fp16 a broadcast and one
// conversion), one FMA per row block and token. A score is four chains
// (elements s, s + 4, ...) summed in one fixed tree inside its 128-bit block:
// no lane-crossing sums, and each key read once for four row blocks, where
// score_rows reduces 16-lane vectors (a fifth of its time) and reads the keys
// once per block of four rows (one thread, 16 rows against 128 fp16 keys in
// L1: 0.90-0.93 of the FMA peak, score_rows's order 0.75-0.78). Measured on
// AMD Zen 5, 2 threads, fp16 GQA 8, 8 x 4096 tokens: four query rows
// 0.92-0.94x the time, one level. Wider groups take them too, where rows in
// the lanes (q transposed, each key element broadcast against a vector of 16
// rows) had scored: one thread, 2048 tokens, K/V in L3, fp16 GQA 16 0.90-0.94x
// the time, GQA 32 0.93-1.00x, latent attention (576-wide rows) with 16 heads
// 0.78-0.79x, 32 0.91-0.92x (bf16 on the FMAs), 64 and 128 0.92-0.97x; 8 x
// 4096 tokens on 2 threads, latent attention's 32 bf16 heads 0.85-0.88x. With
// one block (GQA 4 and one query row) each replicated key feeds a single FMA:
// 1.16x the time there, so GQA 4 keeps score_rows's order for every row count
// in deterministic mode (a draft row has the bits of its single-step decode).
// In fast mode, whose bits may differ between batches, a task of more than
// two row blocks takes quads whatever its group (batch_invariant): fp16 GQA 4
// with four query rows 0.88-0.91x the time, three 0.95-0.97x, two level (one
// thread, 2048 tokens). Otherwise the choice depends on the group alone; a
// score depends on its row's q and key only, whatever the blocking, the other
// rows or the positions.
// AVX2 keeps score_rows's order: two rows to a vector in blocks of 4 x 3
// tokens took 0.97x the time from memory but 1.07-1.09x with the K/V in L3,
// where the FMAs bind (AMD Zen 3; docs/design.md §2).
#if HWY_TARGET == HWY_AVX3 || HWY_TARGET == HWY_AVX3_DL
constexpr bool kQuadScores = true;
#else
constexpr bool kQuadScores = false;
#endif
constexpr int32_t kQuadMinGroup = 8;
constexpr int kQuadRows = 4;    // rows per vector (and per row block)
constexpr int kQuadBlocks = 4;  // row blocks per step at most: 16 accumulators
constexpr int kQuadTokens = 4;  // tokens per step: 16 lines of fp16 keys requested at a time

#if HWY_TARGET == HWY_AVX3 || HWY_TARGET == HWY_AVX3_DL
// q of the task's rows packed by blocks of four rows: block b, step v, lane
// 4r + s holds element 4v + s of row 4b + r (zero past the rows).
template <int kD>
HWY_NOINLINE void pack_q_quads(const PartialTask& t, int32_t rows, float* HWY_RESTRICT qp) {
  const int32_t blocks = (rows + kQuadRows - 1) / kQuadRows;
  std::fill(qp, qp + static_cast<int64_t>(blocks) * kQuadRows * kD, 0.f);
  for (int32_t r = 0; r < rows; ++r) {
    const float* q = t.position[r / t.heads].q + static_cast<int64_t>(r % t.heads) * kD;
    float* out = qp + static_cast<int64_t>(r / kQuadRows) * kQuadRows * kD + (r % kQuadRows) * 4;
    for (int64_t v = 0; v < kD / 4; ++v) std::copy(q + 4 * v, q + 4 * v + 4, out + 16 * v);
  }
}

// Elements p[0 .. 4) as fp32, in every 128-bit block of the vector.
template <typename T>
HWY_INLINE VF load_quad(const T* HWY_RESTRICT p) {
  if constexpr (std::is_same_v<T, float>) {
    return VF{_mm512_broadcast_f32x4(_mm_loadu_ps(p))};
  } else {
    static_assert(sizeof(T) == 2, "fp32, fp16 or bf16 elements");
    int64_t bits;
    std::memcpy(&bits, p, sizeof(bits));
    if constexpr (std::is_same_v<T, hwy::float16_t>) {
      return VF{_mm512_cvtph_ps(_mm256_set1_epi64x(bits))};
    } else {
      // Each bf16 in the top half of its 32-bit lane: the fp32 of the same value.
      return VF{_mm512_castsi512_ps(_mm512_unpacklo_epi16(_mm512_setzero_si512(), _mm512_set1_epi64(bits)))};
    }
  }
}

// The four chains of each lane group of a0..a3 summed, (s0 + s2) + (s1 + s3):
// block r of the result holds row r's sums for the four inputs in order.
HWY_INLINE VF quad_sums4(VF a0, VF a1, VF a2, VF a3) {
  const DF df;
  const hn::Repartition<double, DF> dd;
  const VF s01 = hn::Add(hn::InterleaveLower(df, a0, a1), hn::InterleaveUpper(df, a0, a1));
  const VF s23 = hn::Add(hn::InterleaveLower(df, a2, a3), hn::InterleaveUpper(df, a2, a3));
  return hn::Add(hn::BitCast(df, hn::InterleaveLower(dd, hn::BitCast(dd, s01), hn::BitCast(dd, s23))),
                 hn::BitCast(df, hn::InterleaveUpper(dd, hn::BitCast(dd, s01), hn::BitCast(dd, s23))));
}

// Scores of kBlocks row blocks (packed q at qp, blocks kQuadRows * kD apart)
// against the kQuadTokens keys kt[], written to out[r][t + j] for the blocks'
// rows r (kBlocks * 4 row pointers) and j < count.
template <typename T, int kD, int kBlocks>
HWY_INLINE void quad_step(const float* HWY_RESTRICT qp, const T* HWY_RESTRICT const* kt, float* const* HWY_RESTRICT out,
                          int64_t t, int64_t count) {
  const DF df;
  constexpr int kTok = kQuadTokens;
  static_assert(kTok == 4, "quad_sums4 meets four tokens");
  constexpr int64_t kBlockFloats = kQuadRows * kD;
  VF acc[kBlocks][kTok];
  {
    VF x[kTok];
    for (int j = 0; j < kTok; ++j) x[j] = load_quad(kt[j]);
    for (int b = 0; b < kBlocks; ++b) {
      const VF q = hn::Load(df, qp + b * kBlockFloats);
      for (int j = 0; j < kTok; ++j) acc[b][j] = hn::Mul(q, x[j]);
    }
  }
#pragma GCC unroll 4
  for (int64_t v = 1; v < kD / 4; ++v) {
    VF x[kTok];
    for (int j = 0; j < kTok; ++j) x[j] = load_quad(kt[j] + 4 * v);
    for (int b = 0; b < kBlocks; ++b) {
      const VF q = hn::Load(df, qp + b * kBlockFloats + 16 * v);
      for (int j = 0; j < kTok; ++j) acc[b][j] = hn::MulAdd(q, x[j], acc[b][j]);
    }
  }
  const hn::Full128<float> d4;
  for (int b = 0; b < kBlocks; ++b) {
    HWY_ALIGN float sums[16];
    hn::Store(quad_sums4(acc[b][0], acc[b][1], acc[b][2], acc[b][3]), df, sums);
    for (int r = 0; r < kQuadRows; ++r) {
      float* row = out[b * kQuadRows + r] + t;
      if (HWY_LIKELY(count == kTok)) {
        hn::StoreU(hn::Load(d4, sums + 4 * r), d4, row);
      } else {
        std::memcpy(row, sums + 4 * r, static_cast<size_t>(count) * sizeof(float));
      }
    }
  }
}

// The scores of kBlocks row blocks over the n keys k[0 .. n): steps of
// kQuadTokens tokens (steps of 8 with one or two blocks requested twice the
// lines at a time and measured 1.05-1.15x the time, memory-bound), a tail
// shorter than a step repeating the last key (its scores dropped).
// kLinesPerToken > 0: that many lines per token requested as it goes.
template <typename T, int kD, int kBlocks, int64_t kLinesPerToken, class Rows>
HWY_NOINLINE void score_quad_blocks(const float* HWY_RESTRICT qp, Rows k, int64_t n, float* const* HWY_RESTRICT out,
                                    LinePrefetch& prefetch) {
  constexpr int kTok = kQuadTokens;
  const T* HWY_RESTRICT kt[kTok];
  for (int64_t t = 0; t < n; t += kTok) {
    if constexpr (kLinesPerToken > 0) prefetch.step<kTok * kLinesPerToken>();
    for (int j = 0; j < kTok; ++j) kt[j] = k[std::min<int64_t>(t + j, n - 1)];
    quad_step<T, kD, kBlocks>(qp, kt, out, t, std::min<int64_t>(kTok, n - t));
  }
}

// All rows' scores over the stretch k[0 .. n), into out[r][0 .. n) (rows up
// to the next multiple of 4 written: the padding rows' scores are zero): four
// row blocks at a time, the first four requesting the stretch's lines.
template <typename T, int kD, int64_t kLinesPerToken, class Rows>
HWY_INLINE void score_quads(const float* HWY_RESTRICT qp, int32_t rows, Rows k, int64_t n,
                            float* const* HWY_RESTRICT out, LinePrefetch& prefetch) {
  const int32_t blocks = (rows + kQuadRows - 1) / kQuadRows;
  constexpr int64_t kBlockFloats = kQuadRows * kD;
  int32_t b = 0;
  const auto run = [&](auto count, auto lines) {
    constexpr int kBlocks = decltype(count)::value;
    score_quad_blocks<T, kD, kBlocks, decltype(lines)::value>(qp + b * kBlockFloats, k, n, out + b * kQuadRows,
                                                              prefetch);
    b += kBlocks;
  };
  // The next up to kQuadBlocks blocks, requesting `lines` lines per token.
  const auto next = [&](auto lines) {
    const int32_t left = blocks - b;
    if (left >= kQuadBlocks) return run(std::integral_constant<int, kQuadBlocks>(), lines);
    if (left == 3) return run(std::integral_constant<int, 3>(), lines);
    if (left == 2) return run(std::integral_constant<int, 2>(), lines);
    run(std::integral_constant<int, 1>(), lines);
  };
  next(std::integral_constant<int64_t, kLinesPerToken>());
  while (b < blocks) next(std::integral_constant<int64_t, 0>());
}
#endif

}  // namespace pagoda::cpu::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#endif  // PAGODA_CPU_DECODE_QUADS_INL_H_
