// merge_state: merge_into's weighted sum over the accumulator in SIMD vectors,
// one Highway target per CPU, dispatched at run time. The sum stays two
// products and an add, each rounded (this file is built without FMA
// contraction), so every target gives each element the bits the scalar
// merge_into gives it and a merge's result does not depend on where it runs.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "cpu/state_merge.cc"
#include <hwy/foreach_target.h>  // IWYU pragma: keep

#include <hwy/highway.h>

#include "cpu/state_merge.h"

HWY_BEFORE_NAMESPACE();
namespace pagoda::cpu::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// a[i] = a[i] * wa + b[i] * wb for i < n.
void WeightedSum(float* HWY_RESTRICT a, const float* HWY_RESTRICT b, float wa, float wb, int n) {
  const hn::ScalableTag<float> d;
  const int lanes = static_cast<int>(hn::Lanes(d));
  const auto va = hn::Set(d, wa);
  const auto vb = hn::Set(d, wb);
  int i = 0;
  for (; i + lanes <= n; i += lanes) {
    hn::StoreU(hn::Add(hn::Mul(hn::LoadU(d, a + i), va), hn::Mul(hn::LoadU(d, b + i), vb)), d, a + i);
  }
  ScalarWeightedSum{}(a + i, b + i, wa, wb, n - i);  // the tail
}

}  // namespace pagoda::cpu::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace pagoda::cpu {

HWY_EXPORT(WeightedSum);

void merge_state(SoftmaxStats<float>& a, float* acc_a, const SoftmaxStats<float>& b, const float* acc_b, int n) {
  // merge_into with its accumulator sum in vectors of the dispatched target.
  const auto vectors = [](float* x, const float* y, float wx, float wy, int count) {
    HWY_DYNAMIC_DISPATCH(WeightedSum)(x, y, wx, wy, count);
  };
  merge_into(a, acc_a, b, acc_b, n, vectors);
}

}  // namespace pagoda::cpu
#endif  // HWY_ONCE
