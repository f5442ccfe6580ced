#pragma once
// Merging Decode results from several shards that each hold a disjoint part of the
// same sequences' keys (e.g. the prefix on one server, the recent tokens on
// another). Each shard's (output, LSE) is the online-softmax state
// (m = LSE in base 2, l = 1, acc = output), so the shards merge with the one
// state merge of pagoda/softmax_state.h, exactly as split-KV partials do inside a
// server: o = Σ_s 2^(m_s - m) o_s / Σ_s 2^(m_s - m), LSE = m + log2 Σ ... (in ln).

#include <cstdint>
#include <span>
#include <vector>

#include "pagoda/client/error.h"

namespace pagoda::client {

// One shard's result for the same batch of query rows.
struct ShardResult {
  std::span<const float> output;  // [rows, head_dim] (rows = batch * num_q_heads)
  std::span<const float> lse;     // [rows] natural log; -inf for a shard with no keys
};

struct MergedResult {
  std::vector<float> output;  // [rows, head_dim]
  std::vector<float> lse;     // [rows] natural log; -inf when no shard had keys
};

// Merges the shards in the order given. Fails when the shards' sizes disagree or
// output is not rows * head_dim. A row no shard has keys for comes out as 0 with
// LSE -inf.
Result<MergedResult> merge_shards(std::span<const ShardResult> shards, int32_t head_dim);

}  // namespace pagoda::client
