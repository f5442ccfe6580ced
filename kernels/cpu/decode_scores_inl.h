// q.K for a block of rows against a call's keys: register-blocked steps of
// rows x tokens whose sums go through fixed lane trees, so that a score has
// the same bits wherever it sits in a block.
//
// Part of the CPU kernel's per-target code: decode_cpu.cc includes it after
// Highway's foreach_target, once per SIMD target (hence the toggled guard).

#include <algorithm>
#include <cstdint>
#include <cstring>

#include <hwy/highway.h>

#include "cpu/decode_blocking_inl.h"
#include "cpu/decode_cpu.h"
#include "cpu/decode_reads_inl.h"
#include "cpu/decode_tiles.h"

#if defined(PAGODA_CPU_DECODE_SCORES_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef PAGODA_CPU_DECODE_SCORES_INL_H_
#undef PAGODA_CPU_DECODE_SCORES_INL_H_
#else
#define PAGODA_CPU_DECODE_SCORES_INL_H_
#endif

HWY_BEFORE_NAMESPACE();
namespace pagoda::cpu::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// The lane sums of a0..a3 in lanes 0..3 of one 128-bit vector. Pairs of lanes
// are added inside each 128-bit block first (two interleaves), then the blocks:
// every input's lanes go through the same tree whatever the other inputs are,
// so a score has the same bits wherever it sits in a block.
#if HWY_TARGET != HWY_SCALAR
template <class D = DF, class V = hn::Vec<D>>
HWY_INLINE hn::Vec<hn::Full128<float>> lane_sums4(V a0, V a1, V a2, V a3) {
  const D df;
  const hn::Repartition<uint64_t, D> du;
  const V s01 = hn::Add(hn::InterleaveLower(df, a0, a1), hn::InterleaveUpper(df, a0, a1));
  const V s23 = hn::Add(hn::InterleaveLower(df, a2, a3), hn::InterleaveUpper(df, a2, a3));
  const V u = hn::Add(hn::BitCast(df, hn::InterleaveLower(du, hn::BitCast(du, s01), hn::BitCast(du, s23))),
                      hn::BitCast(df, hn::InterleaveUpper(du, hn::BitCast(du, s01), hn::BitCast(du, s23))));
  const hn::Full128<float> d4;
  if constexpr (hn::MaxLanes(D()) == 4) {
    return u;
  } else if constexpr (hn::MaxLanes(D()) == 8) {
    return hn::Add(hn::LowerHalf(d4, u), hn::UpperHalf(d4, u));
  } else {
    const hn::Half<D> d8;
    const auto h = hn::Add(hn::LowerHalf(d8, u), hn::UpperHalf(d8, u));
    return hn::Add(hn::LowerHalf(d4, h), hn::UpperHalf(d4, h));
  }
}
#endif

// Stores the lane sums of acc (kRows x kTokens accumulators) to out[r][t ..
// t + n). With `room`, out[r][t + n] may be written too: a later step of the
// same rows writes it.
template <int kRows, int kTokens>
HWY_INLINE void store_scores(VF (&acc)[kRows][kTokens], float* const* HWY_RESTRICT out, int64_t t, int64_t n,
                             [[maybe_unused]] bool room) {
#if HWY_TARGET == HWY_SCALAR
  for (int r = 0; r < kRows; ++r)
    for (int64_t j = 0; j < n; ++j) out[r][t + j] = hn::GetLane(acc[r][j]);
#else
  const hn::Full128<float> d4;
  HWY_ALIGN float tail[4];
  if constexpr (kRows == 4 && kTokens == 3) {
    // AVX2's 4 x 3 step: the 12 sums in three trees of four, not four trees
    // of three and a copy. Every input goes through the same tree wherever it
    // sits, so a score has the bits it had. A row's three scores go out as one
    // 4-float store where the fourth lane's slot is written later anyway (AMD
    // Zen 5, fp16 GQA 4, one thread, 2048 tokens: head_dim 64 0.94-0.97x the
    // time, 128 0.97x).
    const hn::Half<decltype(d4)> d2;
    const auto s0 = lane_sums4(acc[0][0], acc[0][1], acc[0][2], acc[1][0]);
    const auto s1 = lane_sums4(acc[1][1], acc[1][2], acc[2][0], acc[2][1]);
    const auto s2 = lane_sums4(acc[3][0], acc[3][1], acc[3][2], acc[2][2]);
    if (HWY_LIKELY(n == 3)) {
      if (HWY_LIKELY(room)) {
        hn::StoreU(s0, d4, out[0] + t);
        hn::StoreU(s2, d4, out[3] + t);
      } else {
        hn::StoreU(hn::LowerHalf(d2, s0), d2, out[0] + t);
        out[0][t + 2] = hn::ExtractLane(s0, 2);
        hn::StoreU(hn::LowerHalf(d2, s2), d2, out[3] + t);
        out[3][t + 2] = hn::ExtractLane(s2, 2);
      }
      out[1][t] = hn::ExtractLane(s0, 3);
      hn::StoreU(hn::LowerHalf(d2, s1), d2, out[1] + t + 1);
      hn::StoreU(hn::UpperHalf(d2, s1), d2, out[2] + t);
      out[2][t + 2] = hn::ExtractLane(s2, 3);
    } else {
      HWY_ALIGN float sums[12];
      hn::Store(s0, d4, sums);
      hn::Store(s1, d4, sums + 4);
      hn::Store(s2, d4, sums + 8);
      constexpr int kAt[4][3] = {{0, 1, 2}, {3, 4, 5}, {6, 7, 11}, {8, 9, 10}};
      for (int r = 0; r < 4; ++r)
        for (int64_t j = 0; j < n; ++j) out[r][t + j] = sums[kAt[r][j]];
    }
  } else if constexpr (kTokens == 4) {
    for (int r = 0; r < kRows; ++r) {
      const auto s = lane_sums4(acc[r][0], acc[r][1], acc[r][2], acc[r][3]);
      if (HWY_LIKELY(n == 4)) {
        hn::StoreU(s, d4, out[r] + t);
      } else {  // a tail step, its last token repeated
        hn::Store(s, d4, tail);
        std::memcpy(out[r] + t, tail, static_cast<size_t>(n) * sizeof(float));
      }
    }
  } else if constexpr (kTokens == 1 && kRows == 4) {
    // AVX2's step of one token, a run's last after its steps of 3.
    const auto s = lane_sums4(acc[0][0], acc[1][0], acc[2][0], acc[3][0]);
    out[0][t] = hn::ExtractLane(s, 0);
    out[1][t] = hn::ExtractLane(s, 1);
    out[2][t] = hn::ExtractLane(s, 2);
    out[3][t] = hn::ExtractLane(s, 3);
  } else if constexpr (kTokens == 2) {
    static_assert(kRows % 2 == 0 || kRows == 1, "rows pair up two tokens at a time");
    if constexpr (kRows == 1) {
      const auto s = lane_sums4(acc[0][0], acc[0][1], acc[0][0], acc[0][1]);
      hn::Store(s, d4, tail);
      std::memcpy(out[0] + t, tail, static_cast<size_t>(n) * sizeof(float));
    } else {
      const hn::Half<decltype(d4)> d2;
      for (int r = 0; r < kRows; r += 2) {
        const auto s = lane_sums4(acc[r][0], acc[r][1], acc[r + 1][0], acc[r + 1][1]);
        if (HWY_LIKELY(n == 2)) {
          hn::StoreU(hn::LowerHalf(d2, s), d2, out[r] + t);
          hn::StoreU(hn::UpperHalf(d2, s), d2, out[r + 1] + t);
        } else {
          hn::Store(s, d4, tail);
          out[r][t] = tail[0];
          out[r + 1][t] = tail[2];
        }
      }
    }
  } else {
    static_assert(kTokens < 0, "steps of 4, 2, and on AVX2 4 x 3 and 4 x 1");
  }
#endif
}

// out[r][t] = q[r] . k[t] for kRows rows and the n key rows k[0 .. n) (of T:
// rows of the cache read in place, or of a converted tile), score_tokens(kRows)
// tokens per step: each loaded K vector feeds kRows FMAs, each loaded q vector
// one per token of the step, and one horizontal tree per four scores remains.
// kLinesPerToken > 0: that many cache lines per token are requested as it goes.
// AVX2 scores every group so: rows in the lanes from GQA 8 (q transposed, each
// key element broadcast against a vector of 8 rows, no horizontal sum) took
// more time on AMD Zen 5 at every width measured (one thread, 2048 tokens, K/V
// in L3, this order's time: fp16 GQA 8 0.87-0.91x with one query row,
// 0.93-0.96x with four, head_dim 64 0.96-0.98x, GQA 16 0.98-1.00x, GQA 32
// 0.89-0.95x, latent attention with 16 and 32 heads 0.92x and with 128
// 0.87-0.88x; 8 x 4096 tokens on 2 threads: GQA 8 0.86x with one query row,
// 0.96x with four, latent attention 0.89-0.92x).
template <typename T, int kD, int kRows, int kTok, int64_t kLinesPerToken>
HWY_INLINE void score_step(const float* HWY_RESTRICT const* qr, const T* HWY_RESTRICT const* kt,
                           float* const* HWY_RESTRICT out, int64_t t, int64_t count, LinePrefetch& prefetch,
                           bool room = false) {
  const DF df;
  constexpr int64_t kLanes = static_cast<int64_t>(hn::MaxLanes(df));
  constexpr int64_t kVecs = kD / kLanes;
  if constexpr (kLinesPerToken > 0) prefetch.step<kTok * kLinesPerToken>();
  VF acc[kRows][kTok];
  if constexpr (kPairedOrder<T> && kWideTarget) {
    static_assert(kVecs % 2 == 0, "whole pairs of vectors");
    for (int64_t v = 0; v < kVecs; v += 2) {
      VF x0[kTok], x1[kTok];
      for (int j = 0; j < kTok; ++j) load_f32_pair(kt[j] + v * kLanes, x0[j], x1[j]);
      for (int r = 0; r < kRows; ++r) {
        const VF q0 = hn::LoadU(df, qr[r] + v * kLanes);
        const VF q1 = hn::LoadU(df, qr[r] + (v + 1) * kLanes);
        for (int j = 0; j < kTok; ++j) {
          acc[r][j] = v == 0 ? hn::Mul(q0, x0[j]) : hn::MulAdd(q0, x0[j], acc[r][j]);
          acc[r][j] = hn::MulAdd(q1, x1[j], acc[r][j]);
        }
      }
    }
    store_scores<kRows, kTok>(acc, out, t, count, room);
    return;
  }
  {
    VF x[kTok];
    for (int j = 0; j < kTok; ++j) x[j] = load_vector(kt[j], 0);
    for (int r = 0; r < kRows; ++r) {
      const VF qv = hn::LoadU(df, qr[r]);
      for (int j = 0; j < kTok; ++j) acc[r][j] = hn::Mul(qv, x[j]);
    }
  }
  for (int64_t v = 1; v < kVecs; ++v) {
    VF x[kTok];
    for (int j = 0; j < kTok; ++j) x[j] = load_vector(kt[j], v);
    for (int r = 0; r < kRows; ++r) {
      const VF qv = hn::LoadU(df, qr[r] + v * kLanes);
      for (int j = 0; j < kTok; ++j) acc[r][j] = hn::MulAdd(qv, x[j], acc[r][j]);
    }
  }
  store_scores<kRows, kTok>(acc, out, t, count, room);
}

template <typename T, int kD, int kRows, int64_t kLinesPerToken, class Rows>
HWY_NOINLINE void score_rows(const float* const* HWY_RESTRICT q, Rows k, int64_t n, float* const* HWY_RESTRICT out,
                             LinePrefetch& prefetch) {
  constexpr int kTok = score_tokens(kRows);
  const float* HWY_RESTRICT qr[kRows];
  for (int r = 0; r < kRows; ++r) qr[r] = q[r];
  const T* HWY_RESTRICT kt[kTok];
  int64_t t = 0;
  if constexpr (kTok == 3) {
    // Steps of 3, then one of 2 or 1 for what is left: a block's 16 tokens take
    // 3+3+3+3+3+1, where a tail step of 3 scored dropped copies and two steps
    // of 2 for the last four tokens took 1.05x the time (AMD Zen 5, fp16 GQA 4,
    // one thread, head_dim 64). The step of 1 first, so that its four
    // chains (bound by their latency) overlap the steps of 3 after them, took
    // 1.01-1.02x the time with one query row and was level with four (8 x 4096
    // tokens, fp16 GQA 4, 2 threads, 6 alternating runs).
    for (; t + 3 <= n; t += 3) {
      for (int j = 0; j < 3; ++j) kt[j] = k[t + j];
      score_step<T, kD, kRows, 3, kLinesPerToken>(qr, kt, out, t, 3, prefetch, n - t > 3);
    }
    if (t + 2 <= n) {
      const T* HWY_RESTRICT pair[2] = {k[t], k[t + 1]};
      score_step<T, kD, kRows, 2, kLinesPerToken>(qr, pair, out, t, 2, prefetch);
      t += 2;
    }
    if (t < n) {
      const T* HWY_RESTRICT one[1] = {k[t]};
      score_step<T, kD, kRows, 1, kLinesPerToken>(qr, one, out, t, 1, prefetch);
      t += 1;
    }
  } else {
    for (; t + kTok <= n; t += kTok) {
      for (int j = 0; j < kTok; ++j) kt[j] = k[t + j];
      score_step<T, kD, kRows, kTok, kLinesPerToken>(qr, kt, out, t, kTok, prefetch);
    }
  }
  if (t < n) {
    // A tail shorter than a step repeats the last token; its scores are dropped.
    for (int j = 0; j < kTok; ++j) kt[j] = k[std::min<int64_t>(t + j, n - 1)];
    score_step<T, kD, kRows, kTok, kLinesPerToken>(qr, kt, out, t, n - t, prefetch);
  }
}

}  // namespace pagoda::cpu::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#endif  // PAGODA_CPU_DECODE_SCORES_INL_H_
