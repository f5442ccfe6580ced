// Highway's foreach_target compiles this file once per SIMD target; the
// dispatcher picks the best one the CPU supports at run time.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "cpu/decode_cpu.cc"
#include <hwy/foreach_target.h>  // IWYU pragma: keep

#include <algorithm>
#include <limits>

#include <hwy/cache_control.h>
#include <hwy/highway.h>

#include "cpu/decode_cpu.h"
#include "pagoda/softmax_state.h"

HWY_BEFORE_NAMESPACE();
namespace pagoda::cpu::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// Tokens converted to fp32 at a time: a tile of K and of V (at most
// 16 x 256 floats each) stays in L1 while every query head of the group uses it.
constexpr int64_t kTileTokens = 16;
// How far ahead the next tiles' K and V are requested from memory.
constexpr int32_t kPrefetchTiles = 2;

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

// q . k over kD elements. a: any alignment (a query row); b: vector-aligned (a
// tile row). Four independent chains: kD is a multiple of 4 vectors on every
// x86 target (64 = 4 x 16 lanes at most).
template <int kD>
HWY_INLINE float dot(const float* HWY_RESTRICT a, const float* HWY_RESTRICT b) {
  const hn::ScalableTag<float> df;
  constexpr int64_t kLanes = static_cast<int64_t>(hn::MaxLanes(df));
  auto s0 = hn::Zero(df), s1 = hn::Zero(df), s2 = hn::Zero(df), s3 = hn::Zero(df);
  int64_t i = 0;
  for (; i + 4 * kLanes <= kD; i += 4 * kLanes) {
    s0 = hn::MulAdd(hn::LoadU(df, a + i), hn::Load(df, b + i), s0);
    s1 = hn::MulAdd(hn::LoadU(df, a + i + kLanes), hn::Load(df, b + i + kLanes), s1);
    s2 = hn::MulAdd(hn::LoadU(df, a + i + 2 * kLanes), hn::Load(df, b + i + 2 * kLanes), s2);
    s3 = hn::MulAdd(hn::LoadU(df, a + i + 3 * kLanes), hn::Load(df, b + i + 3 * kLanes), s3);
  }
  for (; i < kD; i += kLanes) s0 = hn::MulAdd(hn::LoadU(df, a + i), hn::Load(df, b + i), s0);
  return hn::GetLane(hn::SumOfLanes(df, hn::Add(hn::Add(s0, s1), hn::Add(s2, s3))));
}

// 2^x for x <= 0 (a score minus its running max), vectorised: Highway 1.0.3 has
// no Exp2. x = n + f with f in [-0.5, 0.5]; 2^f from its degree-7 Taylor series
// (truncation 5e-9, below fp32 rounding); 2^n built in the exponent bits.
// Terms under 2^-126 of the row max, and -inf (padding), give exactly 0.
template <class D, class V>
HWY_INLINE V exp2_nonpositive(D d, V x) {
  const hn::RebindToSigned<D> di;
  const auto underflow = hn::Lt(x, hn::Set(d, -126.f));
  x = hn::Max(x, hn::Set(d, -126.f));
  const auto n = hn::NearestInt(x);
  const auto f = hn::Sub(x, hn::ConvertTo(d, n));
  auto p = hn::Set(d, 1.5252733804059841e-05f);
  p = hn::MulAdd(p, f, hn::Set(d, 1.5403530393381608e-04f));
  p = hn::MulAdd(p, f, hn::Set(d, 1.3333558146428443e-03f));
  p = hn::MulAdd(p, f, hn::Set(d, 9.6181291076284772e-03f));
  p = hn::MulAdd(p, f, hn::Set(d, 5.5504108664821580e-02f));
  p = hn::MulAdd(p, f, hn::Set(d, 2.4022650695910071e-01f));
  p = hn::MulAdd(p, f, hn::Set(d, 6.9314718055994531e-01f));
  p = hn::MulAdd(p, f, hn::Set(d, 1.f));
  const auto scale = hn::BitCast(d, hn::ShiftLeft<23>(hn::Add(n, hn::Set(di, 127))));
  return hn::IfThenZeroElse(underflow, hn::Mul(p, scale));
}

// Tiles of one KV head are 4 KiB pieces one block stride apart, which the
// hardware prefetcher does not follow. The next tiles' lines are requested a
// few at a time, spread over the compute of the current tile: a burst of a
// whole tile's prefetches stalls the core on its fill buffers instead of
// overlapping with the arithmetic.
class TilePrefetch {
 public:
  // Queues the lines of one tile (K and V, `bytes` each), finishing the last one.
  void start(const void* k, const void* v, int64_t bytes, int64_t steps) {
    step(std::numeric_limits<int64_t>::max());
    k_ = static_cast<const uint8_t*>(k);
    v_ = static_cast<const uint8_t*>(v);
    end_ = bytes;
    next_ = 0;
    per_step_ = std::max<int64_t>(1, ((bytes + 63) / 64 + steps - 1) / steps);
  }
  void step() { step(per_step_); }

 private:
  void step(int64_t lines) {
    for (; lines > 0 && next_ < end_; --lines, next_ += 64) {
      hwy::Prefetch(k_ + next_);
      hwy::Prefetch(v_ + next_);
    }
  }

  const uint8_t* k_ = nullptr;
  const uint8_t* v_ = nullptr;
  int64_t end_ = 0;
  int64_t next_ = 0;
  int64_t per_step_ = 1;
};

// Position of the tile that starts at token `pos` of the chunk [pos, end).
struct TileSpan {
  int64_t offset;  // element offset of its first token in the layer's pool
  int64_t tokens;
};

HWY_INLINE TileSpan tile_at(const PartialTask& t, int64_t pos) {
  const CacheGeometry& g = *t.geometry;
  const int32_t block = t.blocks[pos / g.block_size];
  const auto slot = static_cast<int32_t>(pos % g.block_size);
  const int64_t in_block = std::min<int64_t>(g.block_size - slot, t.end - pos);
  return {g.element_offset(0, block, t.kv_head, slot), std::min(in_block, kTileTokens)};
}

// Folds one tile of n tokens into the states of every query head of the group.
// kN = n when known at compile time (full tiles: loops unroll, scores stay in
// registers), 0 for the partial tiles at block and chunk edges.
// kD = head_dim: the accumulator of one head lives in registers.
template <int kD, int kN>
HWY_INLINE void update_heads(const PartialTask& t, const float* HWY_RESTRICT k_tile,
                             const float* HWY_RESTRICT v_tile, float* HWY_RESTRICT scores, int64_t n_runtime,
                             TilePrefetch& prefetch) {
  const hn::ScalableTag<float> df;
  constexpr int64_t kLanes = static_cast<int64_t>(hn::MaxLanes(df));
  constexpr int64_t kVecs = kD / kLanes;
  const int64_t lanes = kLanes;
  const int64_t n = kN ? kN : n_runtime;
  const int64_t padded = (n + lanes - 1) / lanes * lanes;
  constexpr int64_t d = kD;
  const int32_t group = t.geometry->group_size();
  for (int32_t h = 0; h < group; ++h) {
    const float* q = t.q + h * d;
    for (int64_t j = 0; j < n; ++j) {
      prefetch.step();
      scores[j] = dot<kD>(q, k_tile + j * d);
    }
    for (int64_t j = n; j < padded; ++j) scores[j] = neg_inf<float>();
    auto vmax = hn::Load(df, scores);
    for (int64_t j = lanes; j < padded; j += lanes) vmax = hn::Max(vmax, hn::Load(df, scores + j));
    const float m_new = std::max(t.m[h], hn::GetLane(hn::MaxOfLanes(df, vmax)));
    const float c = rescale_factor(t.m[h], m_new);
    const auto vm = hn::Set(df, m_new);
    auto vsum = hn::Zero(df);
    for (int64_t j = 0; j < padded; j += lanes) {
      const auto p = exp2_nonpositive(df, hn::Sub(hn::Load(df, scores + j), vm));
      hn::Store(p, df, scores + j);
      vsum = hn::Add(vsum, p);
    }
    t.m[h] = m_new;
    t.l[h] = t.l[h] * c + hn::GetLane(hn::SumOfLanes(df, vsum));

    // acc = acc * c + sum_j p_j v_j with acc in registers: one broadcast of p_j
    // feeds kVecs independent FMA chains.
    float* acc = t.acc + h * d;
    const auto vc = hn::Set(df, c);
    hn::Vec<decltype(df)> a[kVecs];
    for (int64_t v = 0; v < kVecs; ++v) a[v] = hn::Mul(hn::LoadU(df, acc + v * kLanes), vc);
    for (int64_t j = 0; j < n; ++j) {
      const auto p = hn::Set(df, scores[j]);
      for (int64_t v = 0; v < kVecs; ++v) a[v] = hn::MulAdd(p, hn::Load(df, v_tile + j * d + v * kLanes), a[v]);
    }
    for (int64_t v = 0; v < kVecs; ++v) hn::StoreU(a[v], df, acc + v * kLanes);
  }
}

template <typename T, int kD>
void partial_impl(const PartialTask& t) {
  const CacheGeometry& g = *t.geometry;
  const int32_t group = g.group_size();
  constexpr int64_t d = kD;

  HWY_ALIGN float k_tile[kTileTokens * 256];
  HWY_ALIGN float v_tile[kTileTokens * 256];
  // Scores of one head over the tile, padded with -inf to whole vectors.
  HWY_ALIGN float scores[64];  // >= kTileTokens rounded up to any target's lane count

  for (int32_t h = 0; h < group; ++h) {
    t.m[h] = neg_inf<float>();
    t.l[h] = 0.f;
    for (int64_t i = 0; i < d; ++i) t.acc[h * d + i] = 0.f;
  }

  const auto* k_base = static_cast<const T*>(t.k_layer);
  const auto* v_base = static_cast<const T*>(t.v_layer);
  // The tile kPrefetchTiles ahead is requested while this one is computed, one
  // step per (token, head) of the score loop.
  TilePrefetch prefetch;
  int64_t ahead = t.begin;
  for (int32_t i = 0; i < kPrefetchTiles && ahead < t.end; ++i) ahead += tile_at(t, ahead).tokens;
  for (int64_t pos = t.begin; pos < t.end;) {
    const TileSpan tile = tile_at(t, pos);
    const int64_t n = tile.tokens;
    if (ahead < t.end) {
      const TileSpan span = tile_at(t, ahead);
      prefetch.start(k_base + span.offset, v_base + span.offset,
                     span.tokens * d * static_cast<int64_t>(sizeof(T)), n * group);
      ahead += span.tokens;
    }
    // The tile's tokens are contiguous: [n][head_dim] inside one block and head.
    load_tile(k_base + tile.offset, k_tile, n * d);
    load_tile(v_base + tile.offset, v_tile, n * d);

    if (n == kTileTokens) {
      update_heads<kD, kTileTokens>(t, k_tile, v_tile, scores, n, prefetch);
    } else {
      update_heads<kD, 0>(t, k_tile, v_tile, scores, n, prefetch);
    }
    pos += n;
  }
}

template <int kD>
void partial_for_dtype(const PartialTask& t) {
  switch (t.geometry->dtype) {
    case DType::kFloat32: return partial_impl<float, kD>(t);
    case DType::kFloat16: return partial_impl<hwy::float16_t, kD>(t);
    case DType::kBFloat16: return partial_impl<hwy::bfloat16_t, kD>(t);
  }
}

// One flat switch over head_dim; the backend validated it (64, 128 or 256).
void ComputePartial(const PartialTask& t) {
  switch (t.geometry->head_dim) {
    case 64: return partial_for_dtype<64>(t);
    case 128: return partial_for_dtype<128>(t);
    case 256: return partial_for_dtype<256>(t);
    default: HWY_ABORT("head_dim %d reached the CPU kernel unvalidated", t.geometry->head_dim);
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
