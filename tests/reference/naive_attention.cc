#include "reference/naive_attention.h"

#include <algorithm>
#include <cmath>
#include <limits>

namespace pagoda::testing {

ReferenceResult naive_decode(const CacheGeometry& g, const std::vector<double>& k_pool,
                             const std::vector<double>& v_pool, int32_t layer,
                             const BatchBlockTables& tables, const std::vector<double>& q,
                             double scale, const ReferenceVariant& variant) {
  const int32_t d = g.head_dim;
  // V's width; under latent attention V is the first dv elements of K's row
  // and v_pool is not read.
  const int32_t dv = g.v_head_dim > 0 ? g.v_head_dim : g.head_dim;
  const std::vector<double>& values = dv < d ? k_pool : v_pool;
  const int32_t group = g.num_q_heads / g.num_kv_heads;
  const int32_t total_rows = variant.q_indptr ? variant.q_indptr[tables.batch] : tables.batch;
  ReferenceResult r;
  r.out.assign(static_cast<size_t>(total_rows) * g.num_q_heads * dv, 0.0);
  r.lse.assign(static_cast<size_t>(total_rows) * g.num_q_heads, -std::numeric_limits<double>::infinity());
  r.score_abs.assign(r.lse.size(), 0.0);
  r.value_abs.assign(r.lse.size(), 0.0);
  r.head_dim = d;
  for (int32_t b = 0; b < tables.batch; ++b) {
    const int64_t len = tables.lengths[b];
    const int32_t first_row = variant.q_indptr ? variant.q_indptr[b] : b;
    const int32_t rows = variant.q_indptr ? variant.q_indptr[b + 1] - variant.q_indptr[b] : 1;
    for (int32_t i = 0; i < rows; ++i) {
      // Bottom-right causality: the last `rows` tokens are the query positions.
      const int64_t pos = len - rows + i;
      int64_t lo = 0;
      if (variant.window > 0) lo = std::max<int64_t>(0, pos - variant.window + 1);
      const int64_t hi = pos + 1;  // exclusive; pos is -1 for one row on an empty sequence
      const int32_t row = first_row + i;
      for (int32_t h = 0; h < g.num_q_heads; ++h) {
        const int32_t kvh = h / group;
        const double* qrow = &q[(static_cast<size_t>(row) * g.num_q_heads + h) * d];
        std::vector<double> scores;
        std::vector<int64_t> offsets;
        for (int64_t t = lo; t < hi; ++t) {
          const int32_t block = tables.block_ids[tables.block_indptr[b] + t / g.block_size];
          offsets.push_back(g.element_offset(layer, block, kvh, static_cast<int32_t>(t % g.block_size)));
          double s = 0;
          double s_abs = 0;
          for (int32_t e = 0; e < d; ++e) {
            s += qrow[e] * k_pool[offsets.back() + e];
            s_abs += std::abs(qrow[e] * k_pool[offsets.back() + e]);
          }
          s *= scale;
          double& row_abs = r.score_abs[static_cast<size_t>(row) * g.num_q_heads + h];
          row_abs = std::max(row_abs, s_abs * scale);
          double& v_abs = r.value_abs[static_cast<size_t>(row) * g.num_q_heads + h];
          for (int32_t e = 0; e < dv; ++e) v_abs = std::max(v_abs, std::abs(values[offsets.back() + e]));
          if (variant.soft_cap > 0) s = variant.soft_cap * std::tanh(s / variant.soft_cap);
          scores.push_back(s);
        }
        const bool sink = variant.sinks != nullptr;
        if (scores.empty() && !sink) continue;
        double mx = sink ? (*variant.sinks)[static_cast<size_t>(h)] : -std::numeric_limits<double>::infinity();
        for (double s : scores) mx = std::max(mx, s);
        double sum = sink ? std::exp((*variant.sinks)[static_cast<size_t>(h)] - mx) : 0.0;
        for (double& s : scores) sum += (s = std::exp(s - mx));
        double* orow = &r.out[(static_cast<size_t>(row) * g.num_q_heads + h) * dv];
        for (size_t t = 0; t < scores.size(); ++t) {
          const double p = scores[t] / sum;
          for (int32_t e = 0; e < dv; ++e) orow[e] += p * values[offsets[t] + e];
        }
        r.lse[static_cast<size_t>(row) * g.num_q_heads + h] = mx + std::log(sum);
      }
    }
  }
  return r;
}

ErrorStats compare(const std::vector<double>& want, const std::vector<float>& got) {
  ErrorStats e;
  double num = 0, den = 0;
  for (size_t i = 0; i < want.size() && i < got.size(); ++i) {
    // A NaN on either side is a failure, never skipped by max(): the
    // reference is NaN only when it read a slot it must not.
    if (std::isnan(got[i]) || std::isnan(want[i])) e.has_nan = true;
    const double diff = static_cast<double>(got[i]) - want[i];
    e.max_abs = std::isnan(diff) ? HUGE_VAL : std::max(e.max_abs, std::abs(diff));
    num += diff * diff;
    den += want[i] * want[i];
  }
  if (want.size() != got.size()) e.has_nan = true;
  e.nmse = den > 0 ? num / den : num;
  return e;
}

}  // namespace pagoda::testing
