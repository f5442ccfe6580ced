#pragma once
// The paged KV cache's bookkeeping: the block pool, each sequence's block table
// and per-layer lengths, reference counts for fork (copy-on-write), and leases
// that pin what a computation in flight reads.
//
// Guarantees:
//  - every append is all-or-nothing: a request that cannot get all the blocks it
//    needs fails with RESOURCE_EXHAUSTED and leaves every sequence as it was;
//  - a sequence's blocks are shared across layers (a block id addresses the same
//    slot in every layer); each layer has its own length;
//  - writing into a block that another sequence also references copies it first;
//  - a Lease holds a reference on every block it names, so a sequence that is
//    freed, forked or grown meanwhile never changes what the lease reads.
// All methods are safe to call concurrently.

#include <cstdint>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include "pagoda/backend.h"
#include "pagoda/status.h"

namespace pagoda {

using SequenceId = uint64_t;

struct SequenceInfo {
  std::string label;
  std::vector<int32_t> layer_lengths;  // [num_layers] tokens cached per layer
  int32_t blocks_held = 0;
};

// New tokens for one layer of several sequences: `tokens_per_sequence` rows per
// sequence, rows of sequence i first. k/v: [ids.size() * tokens_per_sequence,
// num_kv_heads, head_dim] in `dtype`.
struct AppendRows {
  int32_t tokens_per_sequence = 0;
  const void* k = nullptr;
  const void* v = nullptr;
  DType dtype = DType::kFloat32;
};

class CacheManager;

// A pinned view of several sequences' blocks for one layer, in the CSR form the
// backends read. Releases its block references when destroyed.
class Lease {
 public:
  Lease() = default;
  Lease(Lease&& other) noexcept;
  Lease& operator=(Lease&& other) noexcept;
  Lease(const Lease&) = delete;
  Lease& operator=(const Lease&) = delete;
  ~Lease();

  int32_t layer() const { return layer_; }
  int32_t batch() const { return static_cast<int32_t>(lengths_.size()); }
  const std::vector<int32_t>& lengths() const { return lengths_; }
  const std::vector<int32_t>& block_indptr() const { return block_indptr_; }
  const std::vector<int32_t>& block_ids() const { return block_ids_; }
  BatchBlockTables tables() const;

 private:
  friend class CacheManager;
  void release();

  CacheManager* owner_ = nullptr;
  int32_t layer_ = 0;
  std::vector<int32_t> lengths_;
  std::vector<int32_t> block_indptr_;
  std::vector<int32_t> block_ids_;
};

class CacheManager {
 public:
  // The backend owns the pools; the manager hands out its block ids.
  explicit CacheManager(Backend& backend);
  CacheManager(const CacheManager&) = delete;
  CacheManager& operator=(const CacheManager&) = delete;

  const CacheGeometry& geometry() const { return geometry_; }

  SequenceId create(std::string label);
  StatusOr<SequenceId> fork(SequenceId source);
  Status free(SequenceId id);
  StatusOr<SequenceInfo> info(SequenceId id) const;

  // Appends rows to one layer of one sequence; returns the layer's new length.
  StatusOr<int32_t> append(SequenceId id, int32_t layer, int32_t num_tokens, const void* k,
                           const void* v, DType dtype);

  // Optionally appends `rows` to `layer` of every sequence in `ids` (all of them
  // or none), then pins the sequences' blocks and lengths for that layer. `ids`
  // must be distinct (checked).
  StatusOr<Lease> acquire(int32_t layer, std::span<const SequenceId> ids,
                          const AppendRows* rows = nullptr);

  // Pins an explicit prefix of one sequence's layer (the determinism checker
  // recomputes at the length an earlier result saw). length <= current length.
  StatusOr<Lease> acquire_prefix(SequenceId id, int32_t layer, int32_t length);

  int32_t total_blocks() const { return geometry_.num_blocks; }
  int32_t free_blocks() const;
  size_t num_sequences() const;

  // Tests: blocks on the free list, so they can be filled with NaN.
  std::vector<int32_t> free_block_ids() const;

 private:
  friend class Lease;
  struct Sequence {
    std::string label;
    std::vector<int32_t> blocks;
    std::vector<int32_t> lengths;  // [num_layers]
  };

  Status check_layer(int32_t layer) const;
  // Under mu_: blocks the append of n tokens to `layer` of `s` needs (new ones,
  // plus a copy of a shared block it would write into).
  int32_t blocks_needed(const Sequence& s, int32_t layer, int32_t n) const;
  // Under mu_: makes room for n tokens and returns their flat slots.
  Status reserve(Sequence& s, int32_t layer, int32_t n, std::vector<int64_t>& slots);
  int32_t allocate_block();
  void unref_block(int32_t block);
  void release_blocks(const std::vector<int32_t>& blocks);
  Lease make_lease(int32_t layer, std::span<const Sequence* const> seqs,
                   std::span<const int32_t> lengths);

  Backend& backend_;
  CacheGeometry geometry_;
  mutable std::mutex mu_;
  std::unordered_map<SequenceId, Sequence> sequences_;
  std::vector<int32_t> refcount_;  // [num_blocks]
  std::vector<int32_t> free_list_;
  SequenceId next_id_ = 1;
};

}  // namespace pagoda
