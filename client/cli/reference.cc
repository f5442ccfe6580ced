#include "reference.h"

#include <algorithm>
#include <cmath>
#include <limits>

namespace pagoda::client {

ReferenceRow reference_decode(const HeadLayout& layout, std::span<const float> q,
                              std::span<const float> k, std::span<const float> v, double scale) {
  const int32_t d = layout.head_dim;
  const int64_t kv_row = static_cast<int64_t>(layout.num_kv_heads) * d;
  const int64_t n = kv_row > 0 ? static_cast<int64_t>(k.size()) / kv_row : 0;
  const int32_t group = layout.num_q_heads / layout.num_kv_heads;
  if (scale == 0) scale = 1.0 / std::sqrt(static_cast<double>(d));

  ReferenceRow row;
  row.out.assign(static_cast<size_t>(layout.num_q_heads) * d, 0.0);
  row.lse.assign(layout.num_q_heads, -std::numeric_limits<double>::infinity());
  std::vector<double> scores(n);
  for (int32_t h = 0; h < layout.num_q_heads; ++h) {
    const int32_t kvh = h / group;
    const float* qh = q.data() + static_cast<int64_t>(h) * d;
    for (int64_t t = 0; t < n; ++t) {
      const float* kt = k.data() + t * kv_row + static_cast<int64_t>(kvh) * d;
      double dot = 0;
      for (int32_t i = 0; i < d; ++i) dot += static_cast<double>(qh[i]) * kt[i];
      scores[t] = dot * scale;
    }
    if (n == 0) continue;  // no keys: output 0, LSE -inf
    const double m = *std::max_element(scores.begin(), scores.end());
    double sum = 0;
    for (double& s : scores) sum += (s = std::exp(s - m));
    double* out = row.out.data() + static_cast<int64_t>(h) * d;
    for (int64_t t = 0; t < n; ++t) {
      const float* vt = v.data() + t * kv_row + static_cast<int64_t>(kvh) * d;
      const double p = scores[t] / sum;
      for (int32_t i = 0; i < d; ++i) out[i] += p * vt[i];
    }
    row.lse[h] = m + std::log(sum);
  }
  return row;
}

Comparison compare(std::span<const double> want, std::span<const float> got, double atol,
                   double rtol) {
  Comparison c;
  if (want.size() != got.size()) return {std::numeric_limits<double>::infinity(), false};
  for (size_t i = 0; i < want.size(); ++i) {
    const double g = got[i];
    if (std::isnan(g)) {
      c.pass = false;
      c.max_abs_error = std::numeric_limits<double>::infinity();
      continue;
    }
    if (std::isinf(want[i]) || std::isinf(g)) {
      if (want[i] != g) {
        c.pass = false;
        c.max_abs_error = std::numeric_limits<double>::infinity();
      }
      continue;
    }
    const double err = std::abs(g - want[i]);
    c.max_abs_error = std::max(c.max_abs_error, err);
    if (err > atol + rtol * std::abs(want[i])) c.pass = false;
  }
  return c;
}

}  // namespace pagoda::client
