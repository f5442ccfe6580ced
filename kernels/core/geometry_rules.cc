#include "pagoda/geometry_rules.h"

#include <algorithm>
#include <cmath>
#include <utility>
#include <iterator>

namespace pagoda {

Status validate_geometry(const CacheGeometry& g) {
  const struct {
    const char* name;
    int32_t value;
  } positive[] = {{"num_layers", g.num_layers}, {"num_kv_heads", g.num_kv_heads},
                  {"block_size", g.block_size}, {"num_blocks", g.num_blocks}};
  for (const auto& f : positive) {
    if (f.value < 1) return InvalidArgument("{}: expected >= 1, received {}", f.name, f.value);
  }
  if (g.num_q_heads < 1 || g.num_q_heads % g.num_kv_heads != 0) {
    return InvalidArgument("num_q_heads: expected a positive multiple of num_kv_heads ({}), received {}",
                           g.num_kv_heads, g.num_q_heads);
  }
  if (!supported_head_dim(g.head_dim)) {
    return InvalidArgument("head_dim: expected {}, received {}", head_dim_list(), g.head_dim);
  }
  // v_head_dim 0 means head_dim; V narrower than K only where the table says.
  const int32_t v = v_head_dim_for(g.head_dim);
  const int32_t v_got = g.v_head_dim < 0 ? g.v_head_dim : g.v_dim();
  if (v_got != v) {
    if (v == g.head_dim) {
      return InvalidArgument("v_head_dim: expected {} (head_dim) with head_dim {}, received {}", v, g.head_dim, v_got);
    }
    return InvalidArgument("v_head_dim: expected {} with head_dim {} (V is the first {} elements of K's row), "
                           "received {}",
                           v, g.head_dim, v, v_got);
  }
  if (!known_dtype(g.dtype)) {
    return InvalidArgument("cache dtype: expected {}, received {}", cache_dtype_list(), static_cast<int>(g.dtype));
  }
  return Status::Ok();
}

Status validate_kv_scales(std::span<const KvScale> scales, int32_t num_layers) {
  if (scales.empty()) return Status::Ok();
  if (static_cast<int64_t>(scales.size()) != num_layers) {
    return InvalidArgument("kv_scales: expected {} layers (one K and V scale each) or none, received {}", num_layers,
                           scales.size());
  }
  for (size_t l = 0; l < scales.size(); ++l) {
    for (const auto& [name, value] : {std::pair{"k", scales[l].k}, std::pair{"v", scales[l].v}}) {
      if (!std::isfinite(value) || value <= 0.f) {
        return InvalidArgument("kv_scales[{}].{}: expected a finite value > 0, received {}", l, name, value);
      }
    }
  }
  return Status::Ok();
}

Status check_layer(int32_t layer, int32_t num_layers) {
  if (layer < 0 || layer >= num_layers) {
    return InvalidArgument("layer: expected [0, {}), received {}", num_layers, layer);
  }
  return Status::Ok();
}

}  // namespace pagoda
