#pragma once
// The paged KV cache as plain host/device structs: the CPU backend and the CUDA
// kernels address pages the same way.
//
// K and V each live in one pool laid out as
//     [num_layers][num_blocks][num_kv_heads][block_size][head_dim]
// so a block id addresses the same slot in every layer, and the tokens of one KV
// head inside a block are contiguous: a worker for one KV head streams memory.
// Latent attention (v_head_dim < head_dim, docs/design.md §16) has no V pool:
// V is the first v_head_dim elements of each K row, read in place.
// Token t of a sequence sits in block block_ids[indptr[b] + t / block_size] at
// slot t % block_size. All offsets are 64-bit (block * stride overflows 32 bits).

#include <cstdint>

#include "pagoda/dtype.h"
#include "pagoda/hd.h"

namespace pagoda {

struct CacheGeometry {
  int32_t num_layers = 2;
  int32_t num_q_heads = 8;
  int32_t num_kv_heads = 2;
  int32_t head_dim = 64;
  int32_t block_size = 16;
  int32_t num_blocks = 0;
  DType dtype = DType::kFloat16;
  // Elements of a V row (the output's last dimension); 0 means head_dim.
  // Smaller than head_dim: V is the prefix of K's row, stored once. Last, so
  // that positional initialisers written before it keep their meaning.
  int32_t v_head_dim = 0;

  HD int32_t group_size() const { return num_q_heads / num_kv_heads; }
  // V's width, and whether V is K's prefix (then no V pool exists).
  HD int32_t v_dim() const { return v_head_dim > 0 ? v_head_dim : head_dim; }
  HD bool latent() const { return v_dim() < head_dim; }
  // Elements between consecutive tokens, KV heads, blocks and layers.
  HD int64_t token_stride() const { return head_dim; }
  HD int64_t head_stride() const { return static_cast<int64_t>(block_size) * head_dim; }
  HD int64_t block_stride() const { return head_stride() * num_kv_heads; }
  HD int64_t layer_stride() const { return block_stride() * num_blocks; }
  HD int64_t pool_elements() const { return layer_stride() * num_layers; }
  HD int64_t element_offset(int32_t layer, int32_t block, int32_t kv_head, int32_t slot) const {
    return layer * layer_stride() + block * block_stride() + kv_head * head_stride() +
           static_cast<int64_t>(slot) * token_stride();
  }
  // Bytes of K plus V for one token of one layer (K alone when V is its prefix).
  HD int64_t token_kv_bytes() const {
    return (latent() ? 1 : 2) * static_cast<int64_t>(num_kv_heads) * head_dim * static_cast<int64_t>(dtype_size(dtype));
  }
};

// The pools: base pointers of K and V (element type given by geometry.dtype;
// v is null under latent attention, whose V rows are K's).
struct KvPool {
  void* k = nullptr;
  void* v = nullptr;
};

// One launch's view of its sequences for one layer, in CSR form (FlashInfer's
// paged_kv_t): sequence b owns block_ids[block_indptr[b] .. block_indptr[b + 1]).
struct BatchBlockTables {
  int32_t batch = 0;
  const int32_t* block_indptr = nullptr;  // [batch + 1]
  const int32_t* block_ids = nullptr;     // [block_indptr[batch]]
  const int32_t* lengths = nullptr;       // [batch] tokens attended per sequence

  HD int32_t block_of(int32_t b, int64_t token, int32_t block_size) const {
    return block_ids[block_indptr[b] + static_cast<int32_t>(token / block_size)];
  }
};

// Flat slot of a token: block * block_size + offset in block.
HD int64_t flat_slot(int32_t block, int32_t offset, int32_t block_size) {
  return static_cast<int64_t>(block) * block_size + offset;
}

}  // namespace pagoda
