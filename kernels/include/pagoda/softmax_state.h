#pragma once
// The online-softmax state and its merge: the one definition shared by the CPU
// backend, the CUDA kernels and the tests.
//
// For one query row over a set of keys with scores s_i (already multiplied by
// scale * log2(e), so every exponential is a power of two):
//   m   = max_i s_i                    (base-2 log domain; -inf for an empty set)
//   l   = sum_i 2^(s_i - m)            (0 for an empty set)
//   acc = sum_i 2^(s_i - m) * v_i      (0 for an empty set)
// Output o = acc / l; LSE (natural log, at the API only) = (m + log2 l) * ln 2.
// Two states over disjoint key sets merge by rescaling both to m' = max(m_a, m_b);
// the merge is associative and commutative in exact arithmetic.

#include <cmath>
#include <limits>

#include "pagoda/hd.h"

namespace pagoda {

inline constexpr double kLog2e = 1.4426950408889634073599246810018921;
inline constexpr double kLn2 = 0.6931471805599453094172321214581766;

// Folds log2(e) into the softmax scale once, so kernels use exp2 in their loops.
HD float scale_log2(float scale) { return scale * static_cast<float>(kLog2e); }

template <typename T>
HD T neg_inf() {
  return -std::numeric_limits<T>::infinity();
}

HD float exp2_of(float x) { return ::exp2f(x); }
HD double exp2_of(double x) { return ::exp2(x); }
HD float log2_of(float x) { return ::log2f(x); }
HD double log2_of(double x) { return ::log2(x); }

// Factor that moves a state with max m_old onto the max m_new >= m_old.
// An empty state (m_old = -inf) gets 0: this guards 2^(-inf - -inf) = NaN when
// both sides are empty, and is exact otherwise since 2^-inf = 0. An unchanged
// max (most tiles of a row) gets 1 without an exp2: the same value, 2^0.
template <typename T>
HD T rescale_factor(T m_old, T m_new) {
  if (m_old == m_new) return m_old == neg_inf<T>() ? T(0) : T(1);
  return m_old == neg_inf<T>() ? T(0) : exp2_of(m_old - m_new);
}

// Weights of a two-state merge: m = max(m_a, m_b), a = 2^(m_a - m), b = 2^(m_b - m).
template <typename T>
struct MergeWeights {
  T m;
  T a;
  T b;
};

template <typename T>
HD MergeWeights<T> merge_weights(T m_a, T m_b) {
  const T m = m_a > m_b ? m_a : m_b;
  return {m, rescale_factor(m_a, m), rescale_factor(m_b, m)};
}

// 1 / l, or 0 for an empty state so that its output is exactly 0.
template <typename T>
HD T inverse_sum(T l) {
  return l > T(0) ? T(1) / l : T(0);
}

// Natural-log LSE of a state whose m is in base 2; -inf for an empty state.
template <typename T>
HD T natural_lse(T m, T l) {
  return l > T(0) ? (m + log2_of(l)) * static_cast<T>(kLn2) : neg_inf<T>();
}

// Statistics of one state; the accumulator lives beside it (length head_dim),
// in registers on the GPU and in a row of a buffer on the CPU.
template <typename T>
struct SoftmaxStats {
  T m = neg_inf<T>();
  T l = T(0);
};

// acc_a[i] = acc_a[i] * wa + acc_b[i] * wb for i < n, an element at a time:
// merge_into's accumulator sum unless its caller brings its own (the CPU
// backend's, in SIMD vectors: cpu/state_merge.h).
struct ScalarWeightedSum {
  template <typename T>
  HD void operator()(T* acc_a, const T* acc_b, T wa, T wb, int n) const {
    for (int i = 0; i < n; ++i) acc_a[i] = acc_a[i] * wa + acc_b[i] * wb;
  }
};

// Merges (b, acc_b) into (a, acc_a), acc of length n. Merging an empty state on
// either side leaves the other side's bits exactly (by branch: a weighted sum
// would turn an accumulator of -0 into +0), so states that hold no key can join
// a merge anywhere without changing its result.
template <typename T, class WeightedSum = ScalarWeightedSum>
HD void merge_into(SoftmaxStats<T>& a, T* acc_a, const SoftmaxStats<T>& b, const T* acc_b,
                   int n, WeightedSum weighted_sum = {}) {
  if (b.m == neg_inf<T>()) return;
  if (a.m == neg_inf<T>()) {
    a = b;
    for (int i = 0; i < n; ++i) acc_a[i] = acc_b[i];
    return;
  }
  const MergeWeights<T> w = merge_weights(a.m, b.m);
  a.m = w.m;
  a.l = a.l * w.a + b.l * w.b;
  weighted_sum(acc_a, acc_b, w.a, w.b, n);
}

// A state with its accumulator held by value: the form the device code keeps in
// registers (N elements per thread) and the tests use.
template <typename T, int N>
struct SoftmaxState {
  SoftmaxStats<T> stats;
  T acc[N] = {};

  HD void merge(const SoftmaxState& other) { merge_into(stats, acc, other.stats, other.acc, N); }
  HD T lse() const { return natural_lse(stats.m, stats.l); }
};

}  // namespace pagoda
