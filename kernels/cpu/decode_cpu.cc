// Highway's foreach_target compiles this file once per SIMD target; the
// dispatcher picks the best one the CPU supports at run time.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "cpu/decode_cpu.cc"
#include <hwy/foreach_target.h>  // IWYU pragma: keep

#include <algorithm>

#include <hwy/highway.h>

#include "cpu/decode_cpu.h"
#include "pagoda/softmax_state.h"

HWY_BEFORE_NAMESPACE();
namespace pagoda::cpu::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// Tokens converted to fp32 at a time: a tile of K and of V (at most
// 16 x 256 floats each) stays in L1 while every query head of the group uses it.
constexpr int64_t kTileTokens = 16;

template <typename T>
HWY_INLINE void load_tile(const T* HWY_RESTRICT src, float* HWY_RESTRICT dst, int64_t n) {
  const hn::ScalableTag<float> df;
  const hn::Rebind<T, decltype(df)> dt;
  const int64_t lanes = static_cast<int64_t>(hn::Lanes(df));
  for (int64_t i = 0; i < n; i += lanes) hn::Store(hn::PromoteTo(df, hn::LoadU(dt, src + i)), df, dst + i);
}

HWY_INLINE void load_tile(const float* HWY_RESTRICT src, float* HWY_RESTRICT dst, int64_t n) {
  const hn::ScalableTag<float> df;
  const int64_t lanes = static_cast<int64_t>(hn::Lanes(df));
  for (int64_t i = 0; i < n; i += lanes) hn::Store(hn::LoadU(df, src + i), df, dst + i);
}

// a: any alignment (a query row); b: vector-aligned (a tile row).
HWY_INLINE float dot(const float* HWY_RESTRICT a, const float* HWY_RESTRICT b, int64_t n) {
  const hn::ScalableTag<float> df;
  const int64_t lanes = static_cast<int64_t>(hn::Lanes(df));
  auto s0 = hn::Zero(df);
  auto s1 = hn::Zero(df);
  int64_t i = 0;
  for (; i + 2 * lanes <= n; i += 2 * lanes) {
    s0 = hn::MulAdd(hn::LoadU(df, a + i), hn::Load(df, b + i), s0);
    s1 = hn::MulAdd(hn::LoadU(df, a + i + lanes), hn::Load(df, b + i + lanes), s1);
  }
  for (; i < n; i += lanes) s0 = hn::MulAdd(hn::LoadU(df, a + i), hn::Load(df, b + i), s0);
  return hn::GetLane(hn::SumOfLanes(df, hn::Add(s0, s1)));
}

template <typename T>
void partial_impl(const PartialTask& t) {
  const CacheGeometry& g = *t.geometry;
  const int32_t group = g.group_size();
  const int64_t d = g.head_dim;
  const hn::ScalableTag<float> df;
  const int64_t lanes = static_cast<int64_t>(hn::Lanes(df));

  HWY_ALIGN float k_tile[kTileTokens * 256];
  HWY_ALIGN float v_tile[kTileTokens * 256];
  float scores[kTileTokens];

  for (int32_t h = 0; h < group; ++h) {
    t.m[h] = neg_inf<float>();
    t.l[h] = 0.f;
    for (int64_t i = 0; i < d; ++i) t.acc[h * d + i] = 0.f;
  }

  const auto* k_base = static_cast<const T*>(t.k_layer);
  const auto* v_base = static_cast<const T*>(t.v_layer);
  for (int64_t pos = t.begin; pos < t.end;) {
    const int32_t block = t.blocks[pos / g.block_size];
    const int32_t slot = static_cast<int32_t>(pos % g.block_size);
    const int64_t in_block = std::min<int64_t>(g.block_size - slot, t.end - pos);
    const int64_t n = std::min(in_block, kTileTokens);
    const int64_t offset = g.element_offset(0, block, t.kv_head, slot);
    // The tile's tokens are contiguous: [n][head_dim] inside one block and head.
    load_tile(k_base + offset, k_tile, n * d);
    load_tile(v_base + offset, v_tile, n * d);

    for (int32_t h = 0; h < group; ++h) {
      const float* q = t.q + h * d;
      float tile_max = neg_inf<float>();
      for (int64_t j = 0; j < n; ++j) {
        scores[j] = dot(q, k_tile + j * d, d);
        tile_max = std::max(tile_max, scores[j]);
      }
      const float m_new = std::max(t.m[h], tile_max);
      const float c = rescale_factor(t.m[h], m_new);
      float sum = 0.f;
      for (int64_t j = 0; j < n; ++j) sum += (scores[j] = exp2_of(scores[j] - m_new));
      t.m[h] = m_new;
      t.l[h] = t.l[h] * c + sum;

      float* acc = t.acc + h * d;
      const auto vc = hn::Set(df, c);
      for (int64_t i = 0; i < d; i += lanes) {
        auto a = hn::Mul(hn::LoadU(df, acc + i), vc);
        for (int64_t j = 0; j < n; ++j) a = hn::MulAdd(hn::Set(df, scores[j]), hn::Load(df, v_tile + j * d + i), a);
        hn::StoreU(a, df, acc + i);
      }
    }
    pos += n;
  }
}

void ComputePartial(const PartialTask& t) {
  switch (t.geometry->dtype) {
    case DType::kFloat32: return partial_impl<float>(t);
    case DType::kFloat16: return partial_impl<hwy::float16_t>(t);
    case DType::kBFloat16: return partial_impl<hwy::bfloat16_t>(t);
  }
}

const char* TargetName() { return hwy::TargetName(HWY_TARGET); }

}  // namespace pagoda::cpu::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace pagoda::cpu {

HWY_EXPORT(ComputePartial);
HWY_EXPORT(TargetName);

void compute_partial(const PartialTask& task) { HWY_DYNAMIC_DISPATCH(ComputePartial)(task); }
const char* simd_target_name() { return HWY_DYNAMIC_DISPATCH(TargetName)(); }

}  // namespace pagoda::cpu
#endif
