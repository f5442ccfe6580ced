// A task's partial states: where each row's (m, l, acc) lies, their reset,
// the softmax of a sub-block's scores and the sub-block's merge into the states.
//
// Part of the CPU kernel's per-target code: decode_cpu.cc includes it after
// Highway's foreach_target, once per SIMD target (hence the toggled guard).

#include <algorithm>
#include <cstdint>

#include <hwy/highway.h>

#include "cpu/decode_blocking_inl.h"
#include "cpu/decode_cpu.h"
#include "cpu/decode_reads_inl.h"
#include "cpu/decode_softmax_inl.h"
#include "cpu/decode_tiles.h"
#include "cpu/state_merge.h"
#include "pagoda/softmax_state.h"

#if defined(PAGODA_CPU_DECODE_STATES_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef PAGODA_CPU_DECODE_STATES_INL_H_
#undef PAGODA_CPU_DECODE_STATES_INL_H_
#else
#define PAGODA_CPU_DECODE_STATES_INL_H_
#endif

HWY_BEFORE_NAMESPACE();
namespace pagoda::cpu::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// Row r = (position, head) of the task writes its state at this index.
HWY_INLINE int64_t state_index(const PartialTask& t, int32_t r) {
  return t.position[r / t.heads].partial + r % t.heads;
}

// Every row's state starts empty: m = -inf, l = 0, its acc left as it is:
// merges never read the acc of an empty state (merge_into copies over it, the
// launch's merge skips it). At a latent head's 512 elements for up to 128 rows
// a fill would be a pass over 256 KiB per task; on four rows at head_dim 128
// it was 0.6% of a profile's samples (AMD Zen 3, AVX2, one thread, fp16 GQA 4
// with one query row), all in the fill's `rep stos`. With sinks, each row
// starts from its head's sink instead: m = sink, l = 1, acc = 0.
HWY_INLINE void reset_states(const PartialTask& t, int64_t dv) {
  for (int32_t r = 0; r < t.positions * t.heads; ++r) {
    const int64_t i = state_index(t, r);
    if (t.sinks != nullptr) {
      t.m[i] = t.sinks[r % t.heads];
      t.l[i] = 1.f;
      std::fill(t.acc + i * dv, t.acc + (i + 1) * dv, 0.f);
      continue;
    }
    t.m[i] = neg_inf<float>();
    t.l[i] = 0.f;
  }
}

// Each position's keys in sub-block sb, and its rows' weights in place of
// their scores (rows kSubBlockTokens apart). P.V then starts every row's sums
// from zero itself.
HWY_INLINE void softmax_sub_block(const PartialTask& t, const ReadPlan& plan, int64_t sb, float* scores,
                                  SoftmaxStats<float>* stats) {
  const int64_t base = t.chunk_begin + sb * kSubBlockTokens;
  for (int32_t p = 0; p < t.positions; ++p) {
    const ReadPlan::Span keys = plan.keys_of(p, sb);
    for (int32_t h = 0; h < t.heads; ++h) {
      const int32_t r = p * t.heads + h;
      stats[r] = softmax_row(scores + static_cast<int64_t>(r) * kSubBlockTokens, keys.begin - base, keys.end - base,
                             t.soft_cap);
    }
  }
}

// rows x dv sums (dv a multiple of two vectors) from the paired order back
// into element order, in place, before they merge.
HWY_INLINE void from_paired_order(float* HWY_RESTRICT acc, int32_t rows, int64_t dv) {
#if HWY_TARGET == HWY_AVX3 || HWY_TARGET == HWY_AVX3_DL
  // Lane i of the first vector: element i / 2 of the even ones (i even) or of
  // the odd ones (i odd), which _mm512_permutex2var_ps indexes from 16 on.
  const __m512i first = _mm512_setr_epi32(0, 16, 1, 17, 2, 18, 3, 19, 4, 20, 5, 21, 6, 22, 7, 23);
  const __m512i second = _mm512_add_epi32(first, _mm512_set1_epi32(8));
  const int64_t n = rows * dv;
  for (int64_t i = 0; i < n; i += 32) {
    const __m512 even = _mm512_loadu_ps(acc + i);
    const __m512 odd = _mm512_loadu_ps(acc + i + 16);
    _mm512_storeu_ps(acc + i, _mm512_permutex2var_ps(even, first, odd));
    _mm512_storeu_ps(acc + i + 16, _mm512_permutex2var_ps(even, second, odd));
  }
#elif HWY_TARGET == HWY_AVX2
  // Per 128-bit half, the interleaves give e0 o0 e1 o1 | e4 o4 e5 o5 and
  // e2 o2 e3 o3 | e6 o6 e7 o7; their low and high halves joined are the order.
  const DF df;
  const int64_t n = rows * dv;
  for (int64_t i = 0; i < n; i += 16) {
    const VF even = hn::LoadU(df, acc + i);
    const VF odd = hn::LoadU(df, acc + i + 8);
    const VF lo = hn::InterleaveLower(df, even, odd);
    const VF hi = hn::InterleaveUpper(df, even, odd);
    hn::StoreU(hn::ConcatLowerLower(df, hi, lo), df, acc + i);
    hn::StoreU(hn::ConcatUpperUpper(df, hi, lo), df, acc + i + 8);
  }
#else
  (void)acc, (void)rows, (void)dv;
#endif
}

// The sub-block's states join the task's, sub-blocks in position order.
HWY_INLINE void merge_sub_block(const PartialTask& t, const SoftmaxStats<float>* stats, const float* sub_acc,
                                int64_t dv) {
  for (int32_t r = 0; r < t.positions * t.heads; ++r) {
    const int64_t i = state_index(t, r);
    SoftmaxStats<float> running{t.m[i], t.l[i]};
    merge_state(running, t.acc + i * dv, stats[r], sub_acc + r * dv, static_cast<int>(dv));
    t.m[i] = running.m;
    t.l[i] = running.l;
  }
}

}  // namespace pagoda::cpu::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#endif  // PAGODA_CPU_DECODE_STATES_INL_H_
