#include "cpu/state_merge.h"

namespace pagoda::cpu {

void merge_state(SoftmaxStats<float>& a, float* acc_a, const SoftmaxStats<float>& b, const float* acc_b, int n) {
  merge_into(a, acc_a, b, acc_b, n);
}

}  // namespace pagoda::cpu
