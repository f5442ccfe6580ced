#pragma once
// The one merge of two partial states the CPU backend runs, inside a task (a
// sub-block into the task's running state) and after the tasks (a row's
// chunks, cpu_launch.cc) alike. merge_into is a template compiled into each
// caller: in the kernel's source, built once per SIMD target, the compiler
// may fuse its a * x + b * y into a multiply-add that the baseline build of
// the launch cannot, and the two would round differently. Built here with
// no contraction (each product and the sum rounded, as the scalar template
// rounds them), in SIMD vectors of the CPU's best target, a merge has the
// same bits wherever it runs, so a sequence task (pagoda/cpu_sequence_tasks.h)
// folds its chunks as the launch would.

#include "pagoda/softmax_state.h"

namespace pagoda::cpu {

// merge_into(a, acc_a, b, acc_b, n) of pagoda/softmax_state.h.
void merge_state(SoftmaxStats<float>& a, float* acc_a, const SoftmaxStats<float>& b, const float* acc_b, int n);

}  // namespace pagoda::cpu
