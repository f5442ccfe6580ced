#include "reference/naive_attention.h"

#include <cmath>
#include <limits>

namespace pagoda::testing {

ReferenceResult naive_decode(const CacheGeometry& g, const std::vector<double>& k_pool,
                             const std::vector<double>& v_pool, int32_t layer,
                             const BatchBlockTables& tables, const std::vector<double>& q,
                             double scale) {
  const int32_t d = g.head_dim;
  const int32_t group = g.num_q_heads / g.num_kv_heads;
  ReferenceResult r;
  r.out.assign(static_cast<size_t>(tables.batch) * g.num_q_heads * d, 0.0);
  r.lse.assign(static_cast<size_t>(tables.batch) * g.num_q_heads,
               -std::numeric_limits<double>::infinity());
  for (int32_t b = 0; b < tables.batch; ++b) {
    const int64_t len = tables.lengths[b];
    for (int32_t h = 0; h < g.num_q_heads; ++h) {
      const int32_t kvh = h / group;
      const double* qrow = &q[(static_cast<size_t>(b) * g.num_q_heads + h) * d];
      std::vector<double> scores(len);
      std::vector<int64_t> offsets(len);
      for (int64_t t = 0; t < len; ++t) {
        const int32_t block = tables.block_ids[tables.block_indptr[b] + t / g.block_size];
        offsets[t] = g.element_offset(layer, block, kvh, static_cast<int32_t>(t % g.block_size));
        double s = 0;
        for (int32_t i = 0; i < d; ++i) s += qrow[i] * k_pool[offsets[t] + i];
        scores[t] = s * scale;
      }
      if (len == 0) continue;
      double mx = -std::numeric_limits<double>::infinity();
      for (double s : scores) mx = std::max(mx, s);
      double sum = 0;
      for (double& s : scores) sum += (s = std::exp(s - mx));
      double* orow = &r.out[(static_cast<size_t>(b) * g.num_q_heads + h) * d];
      for (int64_t t = 0; t < len; ++t) {
        const double p = scores[t] / sum;
        for (int32_t i = 0; i < d; ++i) orow[i] += p * v_pool[offsets[t] + i];
      }
      r.lse[static_cast<size_t>(b) * g.num_q_heads + h] = mx + std::log(sum);
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
