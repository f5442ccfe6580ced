// P.V: the weights times V's rows, register-blocked as rows x vectors, one
// FMA chain per row and element in token order.
//
// Part of the CPU kernel's per-target code: decode_cpu.cc includes it after
// Highway's foreach_target, once per SIMD target (hence the toggled guard).

#include <algorithm>
#include <cstdint>
#include <type_traits>

#include <hwy/highway.h>

#include "cpu/decode_blocking_inl.h"
#include "cpu/decode_cpu.h"
#include "cpu/decode_reads_inl.h"
#include "cpu/decode_tiles.h"

#if defined(PAGODA_CPU_DECODE_VALUES_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef PAGODA_CPU_DECODE_VALUES_INL_H_
#undef PAGODA_CPU_DECODE_VALUES_INL_H_
#else
#define PAGODA_CPU_DECODE_VALUES_INL_H_
#endif

HWY_BEFORE_NAMESPACE();
namespace pagoda::cpu::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// acc[r] += sum over t in [a, b) of p[r][t] * v[t], for kRows rows and all of kD
// in steps of pv_vectors(kRows) vectors and a narrower last one where they do
// not tile kD (v[t]: a V row, of which the first kD
// elements are read: a row of the cache, the prefix of K's row under latent
// attention, or a row of a converted tile). Each loaded V vector feeds kRows
// FMAs; the weights are broadcast from memory. Where one step covers kD the
// sums stay in registers over all of [a, b); else tokens go kPvChunkTokens at
// a time through every step, so the steps after the first read the chunk's
// rows from L1. Tokens go in order, one FMA chain per (row, vector): the bits
// depend on the row's own keys only. `lines` cache lines per token are
// requested, each step its share. A call over a stretch requests them every
// kPvBurstTokens tokens, the score loop's pace (one burst per 16 tokens
// measured 4-9% slower where the reads are the limit: AMD Zen 5, 2 threads,
// fp16 8 x 4096 tokens, head_dim 64); a call of one run or tile takes each step
// over all of it, with one burst at its start. With `first` the sums start
// from zero (acc is written, not read): a row's first call of a sub-block, so
// that no fill of the accumulators precedes it (AMD Zen 5, AVX2, fp16 GQA 8:
// the fill was 2% of a profile; paired runs level within their noise).
constexpr int64_t kPvChunkTokens = 64;
constexpr int64_t kPvBurstTokens = 4;
template <typename T, int kD, int kRows, class Rows>
HWY_NOINLINE void accumulate_rows(const float* const* HWY_RESTRICT p, Rows v, int64_t a, int64_t b,
                                  float* const* HWY_RESTRICT acc, LinePrefetch& prefetch, int64_t lines,
                                  bool first) {
  const DF df;
  constexpr int64_t kLanes = static_cast<int64_t>(hn::MaxLanes(df));
  constexpr int64_t kVecs = kD / kLanes;
  constexpr int64_t kStep = pv_vectors(kRows) < kVecs ? pv_vectors(kRows) : kVecs;
  static_assert(!kPairedOrder<T> || kVecs % 2 == 0, "whole pairs of vectors");
  const float* HWY_RESTRICT pr[kRows];
  float* HWY_RESTRICT ar[kRows];
  for (int r = 0; r < kRows; ++r) {
    pr[r] = p[r];
    ar[r] = acc[r];
  }
  // Sums stay in registers over a whole chunk: all of [a, b) where one step
  // covers kD.
  constexpr int64_t kChunk = kStep == kVecs || !Rows::kStretch ? kSubBlockTokens : kPvChunkTokens;
  constexpr int64_t kBurst = Rows::kStretch ? kPvBurstTokens : kSubBlockTokens;
  // One step: vectors [v0, v0 + kWidth) of every row over the chunk's tokens.
  const auto step = [&](auto width, int64_t v0, int64_t t0, int64_t t1) {
    constexpr int64_t kWidth = decltype(width)::value;
    VF sum[kRows][kWidth];
    const bool zero = first && t0 == a;
    for (int r = 0; r < kRows; ++r) {
      for (int64_t c = 0; c < kWidth; ++c) sum[r][c] = zero ? hn::Zero(df) : hn::Load(df, ar[r] + (v0 + c) * kLanes);
    }
    // Tokens [u0, u1), token t's row at row_of(t).
    const auto tokens = [&](int64_t u0, int64_t u1, const auto& row_of) HWY_ATTR {
      for (int64_t s0 = u0; s0 < u1; s0 += kBurst) {
        const int64_t s1 = std::min(u1, s0 + kBurst);
        // Each step reads kWidth / kVecs of every row: that share of its lines.
        if (lines > 0) prefetch.step((lines * (s1 - s0) * kWidth + kVecs - 1) / kVecs);
#pragma GCC unroll 2
        for (int64_t t = s0; t < s1; ++t) {
          const T* HWY_RESTRICT whole = row_of(t);
          const T* HWY_RESTRICT row = whole + v0 * kLanes;
          VF x[kWidth];
          if constexpr (kPairedOrder<T> && kStep % 2 != 0) {
            // Steps of three vectors (AVX2) start on either half of a pair.
            for (int64_t c = 0; c < kWidth; ++c) x[c] = load_vector(whole, v0 + c);
          } else if constexpr (kPairedOrder<T>) {
            for (int64_t c = 0; c < kWidth; c += 2) load_f32_pair(row + c * kLanes, x[c], x[c + 1]);
          } else {
            for (int64_t c = 0; c < kWidth; ++c) x[c] = load_f32(row + c * kLanes);
          }
          for (int r = 0; r < kRows; ++r) {
            const VF w = hn::Set(df, pr[r][t]);
            for (int64_t c = 0; c < kWidth; ++c) sum[r][c] = hn::MulAdd(w, x[c], sum[r][c]);
          }
        }
      }
    };
    if constexpr (std::is_same_v<Rows, RunList<T>>) {
      for (int32_t i = 0; i < v.runs; ++i) {
        const int64_t u0 = std::max(t0, v.begin[i]);
        const int64_t u1 = std::min(t1, v.begin[i + 1]);
        if (u0 >= u1) continue;
        const T* HWY_RESTRICT run = v.first[i];
        const int64_t at = v.begin[i];
        const int64_t stride = v.stride;
        tokens(u0, u1, [&](int64_t t) { return run + (t - at) * stride; });
      }
    } else {
      tokens(t0, t1, [&](int64_t t) { return v[t]; });
    }
    for (int r = 0; r < kRows; ++r)
      for (int64_t c = 0; c < kWidth; ++c) hn::Store(sum[r][c], df, ar[r] + (v0 + c) * kLanes);
  };
  for (int64_t t0 = a; t0 < b; t0 += kChunk) {
    const int64_t t1 = std::min(b, t0 + kChunk);
    int64_t v0 = 0;
    for (; v0 + kStep <= kVecs; v0 += kStep) step(std::integral_constant<int64_t, kStep>(), v0, t0, t1);
    if constexpr (kVecs % kStep != 0) step(std::integral_constant<int64_t, kVecs % kStep>(), v0, t0, t1);
  }
}

}  // namespace pagoda::cpu::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#endif  // PAGODA_CPU_DECODE_VALUES_INL_H_
