#pragma once
// The rules a cache geometry and a layer index obey, checked in one place with
// one wording. The server's settings, the backend factory and the request
// decoding call these; the layers below take validated values.

#include <cstdint>
#include <span>

#include "pagoda/backend.h"
#include "pagoda/paged_kv.h"
#include "pagoda/status.h"
#include "pagoda/vocabulary.h"

namespace pagoda {

// Positive sizes, q heads a multiple of KV heads, a supported head_dim with
// the v_head_dim vocabulary.h pairs it with, and a known cache dtype. The message names the field, the expected and the
// received value, e.g. "num_q_heads: expected a positive multiple of
// num_kv_heads (4), received 6".
Status validate_geometry(const CacheGeometry& g);

// Per-layer K/V scales: none, or one finite positive pair per layer.
Status validate_kv_scales(std::span<const KvScale> scales, int32_t num_layers);

// "layer: expected [0, num_layers), received L" when out of range.
Status check_layer(int32_t layer, int32_t num_layers);

}  // namespace pagoda
