#pragma once
// The CLI's own reference for checking a server: decode attention of one
// sequence written the plain way, in double, with all scores materialised and a
// two-pass softmax. It shares no code with the server's kernels on purpose.

#include <cstdint>
#include <span>
#include <vector>

namespace pagoda::client {

struct HeadLayout {
  int32_t num_q_heads = 0;
  int32_t num_kv_heads = 0;
  int32_t head_dim = 0;
};

struct ReferenceRow {
  std::vector<double> out;  // [num_q_heads, head_dim]
  std::vector<double> lse;  // [num_q_heads] natural log; -inf with no keys
};

// q: [num_q_heads, head_dim]; k, v: [n, num_kv_heads, head_dim] (the values as
// the server stores them). Query head h reads KV head h / (num_q_heads /
// num_kv_heads). scale in natural units (0 -> 1/sqrt(head_dim), as the server).
ReferenceRow reference_decode(const HeadLayout& layout, std::span<const float> q,
                              std::span<const float> k, std::span<const float> v, double scale);

// Largest |got - want| and whether the check passed: every element within
// atol + rtol * |want|, no NaN, and -inf exactly where the reference has -inf.
struct Comparison {
  double max_abs_error = 0;
  bool pass = true;
};
Comparison compare(std::span<const double> want, std::span<const float> got, double atol,
                   double rtol);

}  // namespace pagoda::client
