#include "cuda/decode_validation.h"

#include <cmath>
#include <cstdint>

namespace pagoda::cuda {
namespace {

Status check_layer(const CacheGeometry& g, int32_t layer, const char* field) {
  if (layer < 0 || layer >= g.num_layers) {
    return InvalidArgument("{}: expected a layer in [0, {}), received {}", field, g.num_layers,
                           layer);
  }
  return Status::Ok();
}

}  // namespace

bool is_known_dtype(DType t) {
  return t == DType::kFloat32 || t == DType::kFloat16 || t == DType::kBFloat16;
}

Status validate_geometry(const CacheGeometry& g) {
  const struct {
    const char* name;
    int32_t value;
  } positive[] = {{"num_layers", g.num_layers},     {"num_q_heads", g.num_q_heads},
                  {"num_kv_heads", g.num_kv_heads}, {"block_size", g.block_size},
                  {"num_blocks", g.num_blocks}};
  for (const auto& f : positive) {
    if (f.value <= 0) return InvalidArgument("{}: expected > 0, received {}", f.name, f.value);
  }
  if (g.num_q_heads % g.num_kv_heads != 0) {
    return InvalidArgument("num_q_heads: expected a multiple of num_kv_heads ({}), received {}",
                           g.num_kv_heads, g.num_q_heads);
  }
  if (g.num_kv_heads > 65535) {  // the partial kernel's grid.y
    return InvalidArgument("num_kv_heads: expected at most 65535, received {}", g.num_kv_heads);
  }
  if (g.head_dim != 64 && g.head_dim != 128 && g.head_dim != 256) {
    return InvalidArgument("head_dim: expected 64, 128 or 256, received {}", g.head_dim);
  }
  if (!is_known_dtype(g.dtype)) {
    return InvalidArgument("cache dtype: expected fp32, fp16 or bf16, received {}",
                           static_cast<int>(g.dtype));
  }
  return Status::Ok();
}

Status validate_blocks(const CacheGeometry& g, const int32_t* blocks, int32_t count,
                       const char* field) {
  if (count < 0) return InvalidArgument("{} count: expected >= 0, received {}", field, count);
  if (count > 0 && blocks == nullptr) {
    return InvalidArgument("{}: expected {} block ids, received a null pointer", field, count);
  }
  for (int32_t i = 0; i < count; ++i) {
    if (blocks[i] < 0 || blocks[i] >= g.num_blocks) {
      return InvalidArgument("{}[{}]: expected a block in [0, {}), received {}", field, i,
                             g.num_blocks, blocks[i]);
    }
  }
  return Status::Ok();
}

Status validate_decode(const CacheGeometry& g, const DecodeLaunch& l) {
  PAGODA_RETURN_IF_ERROR(check_layer(g, l.layer, "layer"));
  const BatchBlockTables& t = l.tables;
  if (t.batch < 0) return InvalidArgument("batch: expected >= 0, received {}", t.batch);
  if (!is_known_dtype(l.q_dtype)) {
    return InvalidArgument("q dtype: expected fp32, fp16 or bf16, received {}",
                           static_cast<int>(l.q_dtype));
  }
  if (!(std::isfinite(l.scale) && l.scale > 0.f)) {
    return InvalidArgument("scale: expected a finite value > 0, received {}", l.scale);
  }
  if (l.split_tokens <= 0) {
    return InvalidArgument("split_tokens: expected > 0, received {}", l.split_tokens);
  }
  if (t.batch == 0) return Status::Ok();
  if (l.q == nullptr || t.block_indptr == nullptr || t.lengths == nullptr) {
    return InvalidArgument("decode: expected q, block_indptr and lengths for a batch of {}, "
                           "received a null pointer",
                           t.batch);
  }
  for (int32_t b = 0; b < t.batch; ++b) {
    const int32_t first = t.block_indptr[b];
    const int32_t last = t.block_indptr[b + 1];
    if (first < 0 || last < first) {
      return InvalidArgument("block_indptr[{}..{}]: expected 0 <= start <= end, received {}, {}",
                             b, b + 1, first, last);
    }
    const int32_t len = t.lengths[b];
    const int64_t capacity = static_cast<int64_t>(last - first) * g.block_size;
    if (len < 0 || len > capacity) {
      return InvalidArgument("lengths[{}]: expected 0..{} (its {} blocks), received {}", b,
                             capacity, last - first, len);
    }
    const int32_t used = num_chunks(len, g.block_size);
    if (used > 0 && t.block_ids == nullptr) {
      return InvalidArgument("block_ids: expected {} ids, received a null pointer", used);
    }
    if (used > 0) PAGODA_RETURN_IF_ERROR(validate_blocks(g, t.block_ids + first, used, "block_ids"));
  }
  return Status::Ok();
}

Status validate_kv_write(const CacheGeometry& g, const KvWrite& w) {
  PAGODA_RETURN_IF_ERROR(check_layer(g, w.layer, "layer"));
  if (w.num_tokens < 0) {
    return InvalidArgument("num_tokens: expected >= 0, received {}", w.num_tokens);
  }
  if (!is_known_dtype(w.dtype)) {
    return InvalidArgument("k/v dtype: expected fp32, fp16 or bf16, received {}",
                           static_cast<int>(w.dtype));
  }
  if (w.num_tokens == 0) return Status::Ok();
  if (w.slots == nullptr || w.k == nullptr || w.v == nullptr) {
    return InvalidArgument("write_kv: expected slots, k and v for {} tokens, received a null "
                           "pointer",
                           w.num_tokens);
  }
  const int64_t num_slots = static_cast<int64_t>(g.num_blocks) * g.block_size;
  for (int32_t i = 0; i < w.num_tokens; ++i) {
    if (w.slots[i] < 0 || w.slots[i] >= num_slots) {
      return InvalidArgument("slots[{}]: expected a slot in [0, {}), received {}", i, num_slots,
                             w.slots[i]);
    }
  }
  return Status::Ok();
}

}  // namespace pagoda::cuda
