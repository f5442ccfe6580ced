#pragma once
// The oracle: decode attention written apart from every backend. It gathers each
// sequence's keys through the block table, materialises all scores in double and
// runs a plain two-pass softmax. No online state, no merge, no base 2.

#include <cstdint>
#include <vector>

#include "pagoda/paged_kv.h"

namespace pagoda::testing {

struct ReferenceResult {
  std::vector<double> out;  // [rows, num_q_heads, v_head_dim]
  std::vector<double> lse;  // [rows, num_q_heads], natural log; -inf for no keys and no sink
  // What error bounds scale with, per [rows, num_q_heads] (0 for no keys):
  std::vector<double> score_abs;  // max over the row's keys of scale * sum_i |q_i k_i|
  std::vector<double> value_abs;  // max |v| over the row's keys' V elements
  int32_t head_dim = 0;
};

// The attention variants of docs/design.md §9, spelled out here independently.
struct ReferenceVariant {
  // [batch + 1] query rows per sequence; null: one each. Of a sequence's L
  // tokens, row i of n sits at position L - n + i and attends keys up to it.
  const int32_t* q_indptr = nullptr;
  int32_t window = 0;                  // > 0: keys p - window < j <= p
  double soft_cap = 0;                 // > 0: score = cap * tanh(score / cap)
  const std::vector<double>* sinks = nullptr;  // [num_q_heads] natural-log sink logits
};

// k_pool / v_pool: the whole cache as double, laid out as CacheGeometry says.
// Latent attention (v_head_dim < head_dim): V is the first v_head_dim
// elements of each K row, and v_pool is not read.
// q: [rows, num_q_heads, head_dim] as double. scale in natural units.
ReferenceResult naive_decode(const CacheGeometry& g, const std::vector<double>& k_pool,
                             const std::vector<double>& v_pool, int32_t layer,
                             const BatchBlockTables& tables, const std::vector<double>& q,
                             double scale, const ReferenceVariant& variant = {});

// Error of `got` against `want`: per-element max abs error, normalised mean
// squared error sum((got-want)^2) / sum(want^2), and whether any value on
// either side is NaN (then max_abs is infinite).
struct ErrorStats {
  double max_abs = 0;
  double nmse = 0;
  bool has_nan = false;
};
ErrorStats compare(const std::vector<double>& want, const std::vector<float>& got);

}  // namespace pagoda::testing
