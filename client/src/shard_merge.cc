#include "pagoda/client/shard_merge.h"

#include <cmath>

#include <fmt/format.h>

#include "pagoda/softmax_state.h"

namespace pagoda::client {
namespace {

// A shard's row as a state: its output is already normalised (l = 1), and its
// natural LSE becomes the base-2 max the shared merge works with.
SoftmaxStats<float> row_state(float lse_natural) {
  SoftmaxStats<float> s;
  if (lse_natural == neg_inf<float>()) return s;  // no keys: the empty state
  s.m = lse_natural * static_cast<float>(kLog2e);
  s.l = 1.f;
  return s;
}

Error size_error(size_t shard, std::string_view what, size_t want, size_t got) {
  return invalid_argument(fmt::format("shards[{}].{}: expected {} values, received {}", shard, what,
                                      want, got));
}

}  // namespace

Result<MergedResult> merge_shards(std::span<const ShardResult> shards, int32_t head_dim) {
  if (shards.empty()) return invalid_argument("shards: expected at least 1, received 0");
  if (head_dim <= 0) return invalid_argument(fmt::format("head_dim: expected > 0, received {}", head_dim));
  const size_t rows = shards[0].lse.size();
  const size_t row_len = static_cast<size_t>(head_dim);
  for (size_t s = 0; s < shards.size(); ++s) {
    if (shards[s].lse.size() != rows) return size_error(s, "lse", rows, shards[s].lse.size());
    if (shards[s].output.size() != rows * row_len)
      return size_error(s, "output", rows * row_len, shards[s].output.size());
  }

  MergedResult merged;
  merged.output.assign(rows * row_len, 0.f);
  merged.lse.resize(rows);
  std::vector<float> acc_b(row_len);
  for (size_t r = 0; r < rows; ++r) {
    SoftmaxStats<float> total;  // starts empty: merging into it is exact
    float* acc = merged.output.data() + r * row_len;
    for (const ShardResult& shard : shards) {
      const SoftmaxStats<float> part = row_state(shard.lse[r]);
      // An empty shard's output is 0 by contract; zero it here too so that a
      // shard reporting junk beside LSE -inf cannot leak into the sum.
      const float* out = shard.output.data() + r * row_len;
      for (size_t i = 0; i < row_len; ++i) acc_b[i] = part.l > 0.f ? out[i] : 0.f;
      merge_into(total, acc, part, acc_b.data(), head_dim);
    }
    const float inv = inverse_sum(total.l);
    for (size_t i = 0; i < row_len; ++i) acc[i] *= inv;
    merged.lse[r] = natural_lse(total.m, total.l);
  }
  return merged;
}

}  // namespace pagoda::client
