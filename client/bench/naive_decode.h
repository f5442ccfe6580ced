#pragma once
// The naive path pagoda-bench kernel compares against: a contiguous copy of the
// cache ([batch][kv_head][context][head_dim] in the cache dtype), every score of
// a query head materialised, a two-pass softmax, and K/V read once per QUERY
// head (no sharing across a GQA group), the way a straightforward port does it.
// Latent attention (v_head_dim < head_dim): V is read from K's rows, as stored.

#include <cstdint>
#include <vector>

#include "pagoda/paged_kv.h"

namespace pagoda::bench {

class NaiveCache {
 public:
  NaiveCache(const CacheGeometry& g, int32_t batch, int32_t max_context);

  // Stores n tokens of sequence b from position t0; k/v: [n, kv_heads, head_dim] fp32.
  void store(int32_t b, int32_t t0, int32_t n, const float* k, const float* v);

  // out: [batch, q_heads, v_head_dim] fp32; q: [batch, q_heads, head_dim]. Uses `threads` threads.
  void decode(const float* q, int32_t context, float scale, float* out, int32_t threads) const;

 private:
  float load(const std::vector<uint16_t>& pool16, const std::vector<float>& pool32, int64_t i) const;

  CacheGeometry g_;
  int32_t batch_;
  int32_t max_context_;
  std::vector<uint16_t> k16_, v16_;  // 16-bit caches
  std::vector<float> k32_, v32_;     // fp32 caches
};

}  // namespace pagoda::bench
