// The CPU kernel's entry points. Highway's foreach_target compiles this file,
// and the per-target parts it includes, once per SIMD target (the targets:
// kernels/cpu/CMakeLists.txt); the dispatcher picks the best one the CPU
// supports at run time. The parts, in the order each builds on the last:
//   decode_blocking_inl.h   vector types, register blocking
//   decode_reads_inl.h      the cache's elements widened, a call's rows
//   decode_scores_inl.h     q.K in register-blocked steps and lane trees
//   decode_quads_inl.h      quad scores for groups of 8 and wider
//   decode_softmax_inl.h    exp2, lane sums, a row's softmax
//   decode_values_inl.h     P.V
//   decode_states_inl.h     a task's states: reset, softmax, merge
//   decode_stretches_inl.h  tiles, in-place stretches, run lists, row blocks
//   decode_task_inl.h       one task of the FMA path (partial_impl)
//   decode_units_inl.h      the matrix units' path (AMX, AVX512-BF16)
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "cpu/decode_cpu.cc"
#include <hwy/foreach_target.h>  // IWYU pragma: keep

#include <algorithm>
#include <chrono>
#include <cstring>
#include <limits>
#include <type_traits>

#include <hwy/cache_control.h>
#include <hwy/contrib/math/math-inl.h>
#include <hwy/highway.h>

#include "cpu/amx_tiles.h"
#include "cpu/bf16_dot.h"
#include "cpu/decode_cpu.h"
#include "cpu/decode_tiles.h"
#include "cpu/fp8_tables.h"
#include "cpu/phase_clock.h"
#include "cpu/state_merge.h"
#include "pagoda/softmax_state.h"
#include "pagoda/vocabulary.h"

// The per-target parts, in order (above).
#include "cpu/decode_blocking_inl.h"
#include "cpu/decode_reads_inl.h"
#include "cpu/decode_scores_inl.h"
#include "cpu/decode_quads_inl.h"
#include "cpu/decode_softmax_inl.h"
#include "cpu/decode_values_inl.h"
#include "cpu/decode_states_inl.h"
#include "cpu/decode_stretches_inl.h"
#include "cpu/decode_task_inl.h"
#include "cpu/decode_units_inl.h"

HWY_BEFORE_NAMESPACE();
namespace pagoda::cpu::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// V's width is the one vocabulary.h pairs with kD.
template <int kD>
void partial_for_dtype(const PartialTask& t) {
  constexpr int kDv = v_head_dim_for(kD);
  if (t.unit != MatrixUnit::kNone) {
    // Set only where the dispatched target is AVX3 (matrix_unit_for).
#if HWY_TARGET == HWY_AVX3
    if (t.unit == MatrixUnit::kAmx) return partial_for_unit<AmxUnit, kD, kDv>(t);
    return partial_for_unit<DotUnit, kD, kDv>(t);
#else
    HWY_ABORT("the matrix-unit path reached target %s", hwy::TargetName(HWY_TARGET));
#endif
  }
  switch (t.geometry->dtype) {
    case DType::kFloat32: return partial_impl<float, kD, kDv>(t);
    case DType::kFloat16: return partial_impl<hwy::float16_t, kD, kDv>(t);
    case DType::kBFloat16: return partial_impl<hwy::bfloat16_t, kD, kDv>(t);
    case DType::kFloat8E4M3: return partial_impl<Fp8E4M3Bits, kD, kDv>(t);
    case DType::kFloat8E5M2: return partial_impl<Fp8E5M2Bits, kD, kDv>(t);
  }
}

// One instance per head dim of the vocabulary; the geometry was validated
// (geometry_rules.h), so the fallback is unreachable.
void ComputePartial(const PartialTask& t) {
  dispatch_head_dim(
      t.geometry->head_dim, [&](auto d) { partial_for_dtype<decltype(d)::value>(t); },
      [&] { HWY_ABORT("head_dim %d reached the CPU kernel unvalidated", t.geometry->head_dim); });
}

// The softmax's weights 2^x of n values x <= 0 on this target, whole vectors
// and then a tail through a zero-padded one.
void SoftmaxExp2(const float* HWY_RESTRICT x, float* HWY_RESTRICT out, int64_t n) {
  const DF df;
  const int64_t lanes = static_cast<int64_t>(hn::Lanes(df));
  int64_t i = 0;
  for (; i + lanes <= n; i += lanes) hn::StoreU(exp2_nonpositive(hn::LoadU(df, x + i)), df, out + i);
  if (i == n) return;
  alignas(64) float tail[HWY_MAX_BYTES / sizeof(float)] = {};
  std::copy(x + i, x + n, tail);
  hn::Store(exp2_nonpositive(hn::Load(df, tail)), df, tail);
  std::copy(tail, tail + (n - i), out + i);
}

// Independent FMA chains in registers, enough to cover the FMA latency on two
// ports (4 cycles x 2), over a loop long enough to time.
double FmaPeakOneThread() {
  const DF df;
  constexpr int kChains = 12;
  constexpr int64_t kIters = 1 << 22;
  VF a[kChains];
  for (int i = 0; i < kChains; ++i) a[i] = hn::Set(df, 1.f + 1e-7f * static_cast<float>(i));
  const VF m = hn::Set(df, 0.999999f);
  const VF c = hn::Set(df, 1e-7f);
  const auto t0 = std::chrono::steady_clock::now();
  for (int64_t it = 0; it < kIters; ++it) {
    for (int i = 0; i < kChains; ++i) a[i] = hn::MulAdd(a[i], m, c);
  }
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  VF sum = a[0];
  for (int i = 1; i < kChains; ++i) sum = hn::Add(sum, a[i]);
  volatile float sink = hn::GetLane(sum);
  (void)sink;
  return 2.0 * static_cast<double>(hn::Lanes(df)) * kChains * static_cast<double>(kIters) / s;
}

const char* TargetName() { return hwy::TargetName(HWY_TARGET); }

}  // namespace pagoda::cpu::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace pagoda::cpu {

HWY_EXPORT(ComputePartial);
HWY_EXPORT(FmaPeakOneThread);
HWY_EXPORT(SoftmaxExp2);
HWY_EXPORT(TargetName);

void compute_partial(const PartialTask& task) { HWY_DYNAMIC_DISPATCH(ComputePartial)(task); }
const char* simd_target_name() { return HWY_DYNAMIC_DISPATCH(TargetName)(); }
double fma_peak_one_thread() { return HWY_DYNAMIC_DISPATCH(FmaPeakOneThread)(); }
void softmax_exp2(const float* x, float* out, int64_t n) { HWY_DYNAMIC_DISPATCH(SoftmaxExp2)(x, out, n); }

}  // namespace pagoda::cpu
#endif
