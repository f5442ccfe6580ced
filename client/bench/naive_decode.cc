#include "naive_decode.h"

#include <oneapi/tbb/parallel_for.h>
#include <oneapi/tbb/task_arena.h>

#include <algorithm>
#include <cmath>

#include "pagoda/host_convert.h"

namespace pagoda::bench {

NaiveCache::NaiveCache(const CacheGeometry& g, int32_t batch, int32_t max_context)
    : g_(g), batch_(batch), max_context_(max_context) {
  const size_t n = static_cast<size_t>(batch) * g.num_kv_heads * max_context * g.head_dim;
  const size_t nv = g.latent() ? 0 : n;  // latent attention: V lives in K's rows
  if (g.dtype == DType::kFloat32 || is_fp8(g.dtype)) {  // fp8: kept as its values in fp32
    k32_.resize(n);
    v32_.resize(nv);
  } else {
    k16_.resize(n);
    v16_.resize(nv);
  }
}

void NaiveCache::store(int32_t b, int32_t t0, int32_t n, const float* k, const float* v) {
  for (int32_t t = 0; t < n; ++t) {
    for (int32_t h = 0; h < g_.num_kv_heads; ++h) {
      const int64_t dst = ((static_cast<int64_t>(b) * g_.num_kv_heads + h) * max_context_ + t0 + t) * g_.head_dim;
      const int64_t src = (static_cast<int64_t>(t) * g_.num_kv_heads + h) * g_.head_dim;
      if (g_.latent()) {  // K alone, V read from its rows
        if (g_.dtype == DType::kFloat32) {
          std::copy(k + src, k + src + g_.head_dim, k32_.begin() + dst);
        } else if (is_fp8(g_.dtype)) {
          std::vector<uint8_t> codes(static_cast<size_t>(g_.head_dim));
          convert_from_float(k + src, codes.data(), g_.dtype, g_.head_dim);
          convert_to_float(codes.data(), g_.dtype, k32_.data() + dst, g_.head_dim);
        } else {
          convert_from_float(k + src, k16_.data() + dst, g_.dtype, g_.head_dim);
        }
      } else if (g_.dtype == DType::kFloat32) {
        std::copy(k + src, k + src + g_.head_dim, k32_.begin() + dst);
        std::copy(v + src, v + src + g_.head_dim, v32_.begin() + dst);
      } else if (is_fp8(g_.dtype)) {
        std::vector<uint8_t> codes(static_cast<size_t>(g_.head_dim));
        convert_from_float(k + src, codes.data(), g_.dtype, g_.head_dim);
        convert_to_float(codes.data(), g_.dtype, k32_.data() + dst, g_.head_dim);
        convert_from_float(v + src, codes.data(), g_.dtype, g_.head_dim);
        convert_to_float(codes.data(), g_.dtype, v32_.data() + dst, g_.head_dim);
      } else {
        convert_from_float(k + src, k16_.data() + dst, g_.dtype, g_.head_dim);
        convert_from_float(v + src, v16_.data() + dst, g_.dtype, g_.head_dim);
      }
    }
  }
}

float NaiveCache::load(const std::vector<uint16_t>& pool16, const std::vector<float>& pool32, int64_t i) const {
  switch (g_.dtype) {
    case DType::kFloat32: return pool32[i];
    case DType::kFloat16: return fp16_to_float(pool16[i]);
    case DType::kBFloat16: return bf16_to_float(pool16[i]);
    case DType::kFloat8E4M3:
    case DType::kFloat8E5M2: return pool32[i];
  }
  return 0.f;
}

void NaiveCache::decode(const float* q, int32_t context, float scale, float* out, int32_t threads) const {
  const int32_t d = g_.head_dim;
  const int32_t dv = g_.v_dim();
  const bool latent = g_.latent();
  const int32_t group = g_.num_q_heads / g_.num_kv_heads;
  tbb::task_arena arena(threads > 0 ? threads : tbb::task_arena::automatic);
  arena.execute([&] {
    tbb::parallel_for(0, batch_ * g_.num_q_heads, [&](int32_t row) {
      const int32_t b = row / g_.num_q_heads;
      const int32_t kvh = (row % g_.num_q_heads) / group;
      const float* qrow = q + static_cast<int64_t>(row) * d;
      const int64_t base = (static_cast<int64_t>(b) * g_.num_kv_heads + kvh) * max_context_ * d;
      std::vector<float> scores(context);
      float mx = -INFINITY;
      for (int32_t t = 0; t < context; ++t) {
        float s = 0;
        for (int32_t i = 0; i < d; ++i) s += qrow[i] * load(k16_, k32_, base + static_cast<int64_t>(t) * d + i);
        scores[t] = s * scale;
        mx = std::max(mx, scores[t]);
      }
      float sum = 0;
      for (float& s : scores) sum += (s = std::exp(s - mx));
      float* orow = out + static_cast<int64_t>(row) * dv;
      std::fill(orow, orow + dv, 0.f);
      const std::vector<uint16_t>& v16 = latent ? k16_ : v16_;
      const std::vector<float>& v32 = latent ? k32_ : v32_;
      for (int32_t t = 0; t < context; ++t) {
        const float p = scores[t] / sum;
        for (int32_t i = 0; i < dv; ++i) orow[i] += p * load(v16, v32, base + static_cast<int64_t>(t) * d + i);
      }
    });
  });
}

}  // namespace pagoda::bench
