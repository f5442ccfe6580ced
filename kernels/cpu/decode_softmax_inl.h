// The softmax's pieces: 2^x for x <= 0, a vector's lanes summed in a fixed
// tree, and one row's softmax over its scores of a sub-block.
//
// Part of the CPU kernel's per-target code: decode_cpu.cc includes it after
// Highway's foreach_target, once per SIMD target (hence the toggled guard).

#include <cstdint>

#include <hwy/highway.h>

#include "cpu/decode_blocking_inl.h"
#include "pagoda/softmax_state.h"

#if defined(PAGODA_CPU_DECODE_SOFTMAX_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef PAGODA_CPU_DECODE_SOFTMAX_INL_H_
#undef PAGODA_CPU_DECODE_SOFTMAX_INL_H_
#else
#define PAGODA_CPU_DECODE_SOFTMAX_INL_H_
#endif

HWY_BEFORE_NAMESPACE();
namespace pagoda::cpu::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// 2^x for x <= 0 (a score minus its row max), vectorised: Highway 1.0.3 has
// no Exp2. x = n + f with f in [-0.5, 0.5]; 2^f from its degree-7 Taylor series
// (truncation 5e-9, below fp32 rounding); 2^n built in the exponent bits,
// or on AVX-512 applied by VSCALEFPS (n rounded in place: 13 instructions
// where the bits took 17; the same product, exact or rounded once alike;
// AMD Zen 5, 2 threads, bf16 GQA 4 with four query rows: 0.96x the time).
// Terms under 2^-126 of the row max, and -inf (masked keys), give exactly 0.
HWY_INLINE VF exp2_nonpositive(VF x) {
  const DF d;
  const auto underflow = hn::Lt(x, hn::Set(d, -126.f));
  x = hn::Max(x, hn::Set(d, -126.f));
#if HWY_TARGET == HWY_AVX3 || HWY_TARGET == HWY_AVX3_DL
  const VF n = hn::Round(x);
  const VF f = hn::Sub(x, n);
#else
  // x + 1.5 * 2^23 holds round(x) (nearest-even, as NearestInt) in its low
  // significand bits: its bits are 0x4B400000 + n for n in [-126, 0], whose
  // high bits the shift below drops. Two adds where NearestInt's fix-up of
  // out-of-range lanes (none here) and the conversion back took six; n and f
  // equal theirs for every float in [-126, 0] (checked exhaustively). AMD Zen
  // 5, fp16 GQA 4, one thread, 2048 tokens: head_dim 64 0.97-0.98x the time,
  // 128 0.98-0.99x.
  const hn::RebindToSigned<DF> di;
  const VF magic = hn::Set(d, 12582912.f);
  const VF shifted = hn::Add(x, magic);
  const auto n_bits = hn::BitCast(di, shifted);  // 0x4B400000 + n
  const auto f = hn::Sub(x, hn::Sub(shifted, magic));
#endif
  auto p = hn::Set(d, 1.5252733804059841e-05f);
  p = hn::MulAdd(p, f, hn::Set(d, 1.5403530393381608e-04f));
  p = hn::MulAdd(p, f, hn::Set(d, 1.3333558146428443e-03f));
  p = hn::MulAdd(p, f, hn::Set(d, 9.6181291076284772e-03f));
  p = hn::MulAdd(p, f, hn::Set(d, 5.5504108664821580e-02f));
  p = hn::MulAdd(p, f, hn::Set(d, 2.4022650695910071e-01f));
  p = hn::MulAdd(p, f, hn::Set(d, 6.9314718055994531e-01f));
  p = hn::MulAdd(p, f, hn::Set(d, 1.f));
#if HWY_TARGET == HWY_AVX3 || HWY_TARGET == HWY_AVX3_DL
  return hn::IfThenZeroElse(underflow, VF{_mm512_scalef_ps(p.raw, n.raw)});
#else
  const auto scale = hn::BitCast(d, hn::ShiftLeft<23>(hn::Add(n_bits, hn::Set(di, 127))));
  return hn::IfThenZeroElse(underflow, hn::Mul(p, scale));
#endif
}

// The lanes of v summed in a fixed tree, whichever compiler built it: on
// AVX-512 lane i with i + 8, then i with i + 4, i with i + 2, 0 with 1 (the
// order GCC's _mm512_reduce_add_ps takes; softmax_keys sums rows-in-lanes
// vectors in the same pairs, so the two forms of the softmax give a row the
// same bits). Elsewhere Highway's sum.
HWY_INLINE float sum_lanes(VF v) {
#if HWY_TARGET == HWY_AVX3 || HWY_TARGET == HWY_AVX3_DL
  const hn::Half<DF> d8;
  const hn::Half<decltype(d8)> d4;
  const auto v8 = hn::Add(hn::LowerHalf(d8, v), hn::UpperHalf(d8, v));
  const auto v4 = hn::Add(hn::LowerHalf(d4, v8), hn::UpperHalf(d4, v8));
  const auto v2 = hn::Add(v4, hn::Shuffle1032(v4));  // lanes 0 + 2, 1 + 3
  return hn::GetLane(hn::Add(v2, hn::Shuffle2301(v2)));
#else
  return hn::GetLane(hn::SumOfLanes(DF(), v));
#endif
}

// Row scores s[first, end) (relative to the sub-block) become softmax weights
// 2^(s - m) in place; returns the row's (m, l). Lanes hold fixed positions:
// the loop runs over the vectors that cover [first, end), the lanes outside it
// are set to -inf (weight 0), so a row has these bits whatever other rows or
// positions its task holds. soft_cap > 0: s = cap * tanh(s / cap) * log2(e) first.
HWY_INLINE SoftmaxStats<float> softmax_row(float* HWY_RESTRICT s, int64_t first, int64_t end, float soft_cap) {
  const DF df;
  constexpr int64_t kLanes = static_cast<int64_t>(hn::MaxLanes(df));
  SoftmaxStats<float> st;
  if (first >= end) return st;
  const int64_t lo = first / kLanes * kLanes;
  const int64_t hi = (end + kLanes - 1) / kLanes * kLanes;
  if (soft_cap > 0.f) {
    const VF inv_cap = hn::Set(df, 1.f / soft_cap);
    const VF cap_log2 = hn::Set(df, soft_cap * static_cast<float>(kLog2e));
    for (int64_t i = lo; i < hi; i += kLanes) {
      hn::Store(hn::Mul(cap_log2, hn::Tanh(df, hn::Mul(hn::Load(df, s + i), inv_cap))), df, s + i);
    }
  }
  for (int64_t i = lo; i < first; ++i) s[i] = neg_inf<float>();
  for (int64_t i = end; i < hi; ++i) s[i] = neg_inf<float>();
  VF vmax = hn::Load(df, s + lo);
  for (int64_t i = lo + kLanes; i < hi; i += kLanes) vmax = hn::Max(vmax, hn::Load(df, s + i));
  st.m = hn::GetLane(hn::MaxOfLanes(df, vmax));
  if (st.m == neg_inf<float>()) return {};
  const VF vm = hn::Set(df, st.m);
  VF vsum = hn::Zero(df);
  int64_t i = lo;
  // Four exponentials side by side, each a chain of dependent FMAs, so the
  // chains overlap in the core's window (bf16 GQA 4 with four query rows,
  // cache-resident: 0.99x the time; two on AVX2, whose 16 registers spill
  // the four's constants, measured level). The sum still adds them in order
  // (the same bits).
  for (; i + 4 * kLanes <= hi; i += 4 * kLanes) {
    VF p[4];
    for (int j = 0; j < 4; ++j) p[j] = exp2_nonpositive(hn::Sub(hn::Load(df, s + i + j * kLanes), vm));
    for (int j = 0; j < 4; ++j) {
      hn::Store(p[j], df, s + i + j * kLanes);
      vsum = hn::Add(vsum, p[j]);
    }
  }
  for (; i < hi; i += kLanes) {
    const VF p = exp2_nonpositive(hn::Sub(hn::Load(df, s + i), vm));
    hn::Store(p, df, s + i);
    vsum = hn::Add(vsum, p);
  }
  st.l = sum_lanes(vsum);
  return st;
}

}  // namespace pagoda::cpu::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#endif  // PAGODA_CPU_DECODE_SOFTMAX_INL_H_
