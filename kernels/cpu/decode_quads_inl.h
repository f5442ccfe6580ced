// Quad scores for groups of 8 query heads and wider: four rows a vector on
// AVX-512 and two on AVX2, each key read once for four row blocks.
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
//
// AVX2 takes them for fp32 and fp16 caches by the same rule, two rows to a
// vector (lane 4r + s), four row blocks x three tokens (12 accumulators; each
// key's four elements one 64-bit broadcast and a conversion; q from memory);
// the scores have AVX-512's quad bits. They read an fp16 cache in place up to
// 16 rows and from an fp32 tile beyond, as score_rows does: AMD Zen 3, 8 x
// 4096 tokens on 2 threads, medians of 6 to 12 alternating runs, fp16 GQA 8
// with one query row 0.97x the time, four 0.88-0.94x (in place, 0.95-0.98x),
// GQA 16 with one level, four 0.95x, latent attention's 32 fp16 heads 0.96x,
// fast mode's GQA 4 with four 0.96-0.98x, fp32 GQA 8 0.93x. One query row at
// GQA 8 with its K/V in L3 (one pinned thread, one KV head's 2048 tokens) took
// 1.02-1.09x: there the FMAs bind, and each key's conversion feeds four FMAs,
// as in score_rows, while four such rows gain (0.92-0.94x).
#if HWY_TARGET == HWY_AVX3 || HWY_TARGET == HWY_AVX3_DL || HWY_TARGET == HWY_AVX2
constexpr bool kQuadScores = true;
#else
constexpr bool kQuadScores = false;
#endif
// Whether a cache of T scores so on this target. AVX2 scores fp32 and fp16
// keys so; bf16 keeps score_rows's paired order, one instruction widening
// eight elements where a quad's four took one or two (AMD Zen 3, 8 x 4096
// tokens on 2 threads, medians of 8 alternating runs: bf16 GQA 8 with one
// query row 1.06x the time, four 1.06x, latent attention's 32 heads 1.09x),
// and fp8, widened into a tile of fp16 anyway, measured level (e4m3 GQA 8
// 1.01-1.02x by median).
template <typename T>
constexpr bool kQuadScoresFor =
    kQuadScores && (kWideTarget || std::is_same_v<T, float> || std::is_same_v<T, hwy::float16_t>);
constexpr int32_t kQuadMinGroup = 8;
constexpr int32_t kQuadFastRows = 8;  // fast mode: quads for any group past this many rows
constexpr int kQuadRows = kWideTarget ? 4 : 2;  // rows per vector (and per row block)
constexpr int kQuadBlocks = 4;                  // row blocks per step at most
// Tokens per step: AVX-512's 4 x 4 blocks x tokens request 16 lines of fp16
// keys at a time; AVX2's 4 x 3 hold 12 accumulators and the step's 3 keys in
// its 16 registers, q read from memory by the FMAs.
constexpr int kQuadTokens = kWideTarget ? 4 : 3;

#if HWY_TARGET == HWY_AVX3 || HWY_TARGET == HWY_AVX3_DL || HWY_TARGET == HWY_AVX2
// q of the task's rows packed by blocks of kQuadRows rows: block b, step v,
// lane 4r + s holds element 4v + s of row kQuadRows * b + r (zero past the
// rows).
template <int kD>
HWY_NOINLINE void pack_q_quads(const PartialTask& t, int32_t rows, float* HWY_RESTRICT qp) {
  constexpr int64_t kStep = 4 * kQuadRows;
  const int32_t blocks = (rows + kQuadRows - 1) / kQuadRows;
  std::fill(qp, qp + static_cast<int64_t>(blocks) * kQuadRows * kD, 0.f);
  for (int32_t r = 0; r < rows; ++r) {
    const float* q = t.position[r / t.heads].q + static_cast<int64_t>(r % t.heads) * kD;
    float* out = qp + static_cast<int64_t>(r / kQuadRows) * kQuadRows * kD + (r % kQuadRows) * 4;
    for (int64_t v = 0; v < kD / 4; ++v) std::copy(q + 4 * v, q + 4 * v + 4, out + kStep * v);
  }
}

// Elements p[0 .. 4) as fp32, in every 128-bit block of the vector.
template <typename T>
HWY_INLINE VF load_quad(const T* HWY_RESTRICT p) {
#if HWY_TARGET == HWY_AVX2
  static_assert(kQuadScoresFor<T>, "AVX2's quads read fp32 and fp16 keys");
  if constexpr (std::is_same_v<T, float>) {
    return VF{_mm256_broadcast_ps(reinterpret_cast<const __m128*>(p))};
  } else {
    int64_t bits;
    std::memcpy(&bits, p, sizeof(bits));
    return VF{_mm256_cvtph_ps(_mm_set1_epi64x(bits))};
  }
#else
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
#endif
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

// Writes the scores of acc (kBlocks row blocks x kTok tokens: block b's row
// r is out[kQuadRows * b + r]) to out[row][t + j] for j < count. With `room`,
// out[row][t + kTok] may be written too: a later step of the call writes it.
template <int kBlocks, int kTok>
HWY_INLINE void store_quad_scores(VF (&acc)[kBlocks][kTok], float* const* HWY_RESTRICT out, int64_t t, int64_t count,
                                  [[maybe_unused]] bool room) {
  const DF df;
  constexpr int kLanes = static_cast<int>(hn::MaxLanes(DF()));
  const hn::Full128<float> d4;
  if constexpr (kTok == 4) {
    for (int b = 0; b < kBlocks; ++b) {
      HWY_ALIGN float sums[kLanes];
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
  } else if constexpr (kBlocks == 4 && kTok == 3) {
#if HWY_TARGET == HWY_AVX2
    // AVX2's 4 x 3 step (count is 3): the 12 sums in three trees of four, as
    // score_rows's step groups its own, each row's scores stored from the
    // registers: half r of a tree holds the rows r of its blocks.
    const __m256 s0 = quad_sums4(acc[0][0], acc[0][1], acc[0][2], acc[1][0]).raw;
    const __m256 s1 = quad_sums4(acc[1][1], acc[1][2], acc[2][0], acc[2][1]).raw;
    const __m256 s2 = quad_sums4(acc[3][0], acc[3][1], acc[3][2], acc[2][2]).raw;
    const auto put = [&](int r, __m128 a, __m128 b, __m128 c) {
      float* o0 = out[r] + t;                  // a: block 0's three, block 1's first
      float* o1 = out[kQuadRows + r] + t;      // b: block 1's last two, block 2's first two
      float* o2 = out[2 * kQuadRows + r] + t;  // c: block 3's three, block 2's last
      float* o3 = out[3 * kQuadRows + r] + t;
      if (HWY_LIKELY(room)) {
        _mm_storeu_ps(o0, a);
        _mm_storeu_ps(o3, c);
      } else {
        HWY_ALIGN float sums[8];
        _mm_store_ps(sums, a);
        _mm_store_ps(sums + 4, c);
        std::memcpy(o0, sums, 3 * sizeof(float));
        std::memcpy(o3, sums + 4, 3 * sizeof(float));
      }
      const int a3 = _mm_extract_ps(a, 3);
      const int c3 = _mm_extract_ps(c, 3);
      std::memcpy(o1, &a3, sizeof(float));
      _mm_storel_pi(reinterpret_cast<__m64*>(o1 + 1), b);
      _mm_storeh_pi(reinterpret_cast<__m64*>(o2), b);
      std::memcpy(o2 + 2, &c3, sizeof(float));
    };
    put(0, _mm256_castps256_ps128(s0), _mm256_castps256_ps128(s1), _mm256_castps256_ps128(s2));
    put(1, _mm256_extractf128_ps(s0, 1), _mm256_extractf128_ps(s1, 1), _mm256_extractf128_ps(s2, 1));
#else
    static_assert(kTok != 3, "steps of three tokens are AVX2's");
#endif
  } else {
    // Other blockings (AVX2's steps of 2 and 1, fewer than four blocks): the
    // accumulators in block-major order, four to a tree, then each score
    // copied. A tree adds each input's lanes the same way wherever it sits.
    constexpr int kAcc = kBlocks * kTok;
    constexpr int kTrees = (kAcc + 3) / 4;
    HWY_ALIGN float sums[kTrees * kLanes];
    const auto at = [&](int i) {
      i = std::min(i, kAcc - 1);
      return acc[i / kTok][i % kTok];
    };
    for (int g = 0; g < kTrees; ++g)
      hn::Store(quad_sums4(at(4 * g), at(4 * g + 1), at(4 * g + 2), at(4 * g + 3)), df, sums + g * kLanes);
    for (int b = 0; b < kBlocks; ++b)
      for (int r = 0; r < kQuadRows; ++r)
        for (int64_t j = 0; j < count; ++j) {
          const int i = b * kTok + static_cast<int>(j);
          out[b * kQuadRows + r][t + j] = sums[i / 4 * kLanes + 4 * r + i % 4];
        }
  }
}

// Scores of kBlocks row blocks (packed q at qp, blocks kQuadRows * kD apart)
// against the kTok keys kt[], written to out[r][t + j] for the blocks' rows r
// (kBlocks * kQuadRows row pointers) and j < count.
template <typename T, int kD, int kBlocks, int kTok>
HWY_INLINE void quad_step(const float* HWY_RESTRICT qp, const T* HWY_RESTRICT const* kt, float* const* HWY_RESTRICT out,
                          int64_t t, int64_t count, bool room) {
  const DF df;
  constexpr int64_t kLanes = static_cast<int64_t>(hn::MaxLanes(DF()));
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
      const VF q = hn::Load(df, qp + b * kBlockFloats + kLanes * v);
      for (int j = 0; j < kTok; ++j) acc[b][j] = hn::MulAdd(q, x[j], acc[b][j]);
    }
  }
  store_quad_scores<kBlocks, kTok>(acc, out, t, count, room);
}

// The scores of kBlocks row blocks over the n keys k[0 .. n). AVX-512: steps
// of kQuadTokens tokens (steps of 8 with one or two blocks requested twice the
// lines at a time and measured 1.05-1.15x the time, memory-bound), a tail
// shorter than a step repeating the last key (its scores dropped). AVX2:
// steps of 3, then one of 2 or 1 for what is left, as score_rows takes them.
// kLinesPerToken > 0: that many lines per token requested as it goes.
template <typename T, int kD, int kBlocks, int64_t kLinesPerToken, class Rows>
HWY_NOINLINE void score_quad_blocks(const float* HWY_RESTRICT qp, Rows k, int64_t n, float* const* HWY_RESTRICT out,
                                    LinePrefetch& prefetch) {
  constexpr int kTok = kQuadTokens;
  const T* HWY_RESTRICT kt[kTok];
  if constexpr (kTok == 3) {
    int64_t t = 0;
    for (; t + 3 <= n; t += 3) {
      if constexpr (kLinesPerToken > 0) prefetch.step<3 * kLinesPerToken>();
      for (int j = 0; j < 3; ++j) kt[j] = k[t + j];
      quad_step<T, kD, kBlocks, 3>(qp, kt, out, t, 3, n - t > 3);
    }
    if (t + 2 <= n) {
      if constexpr (kLinesPerToken > 0) prefetch.step<2 * kLinesPerToken>();
      const T* HWY_RESTRICT pair[2] = {k[t], k[t + 1]};
      quad_step<T, kD, kBlocks, 2>(qp, pair, out, t, 2, false);
      t += 2;
    }
    if (t < n) {
      if constexpr (kLinesPerToken > 0) prefetch.step<kLinesPerToken>();
      const T* HWY_RESTRICT one[1] = {k[t]};
      quad_step<T, kD, kBlocks, 1>(qp, one, out, t, 1, false);
    }
  } else {
    for (int64_t t = 0; t < n; t += kTok) {
      if constexpr (kLinesPerToken > 0) prefetch.step<kTok * kLinesPerToken>();
      for (int j = 0; j < kTok; ++j) kt[j] = k[std::min<int64_t>(t + j, n - 1)];
      quad_step<T, kD, kBlocks, kTok>(qp, kt, out, t, std::min<int64_t>(kTok, n - t), false);
    }
  }
}

// All rows' scores over the stretch k[0 .. n), into out[r][0 .. n) (rows up
// to the next multiple of kQuadRows written: the padding rows' scores are zero): four
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
