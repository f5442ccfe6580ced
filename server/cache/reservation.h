#pragma once
// A Reservation: what one computation in flight holds of the cache for one
// layer. It pins the blocks its sequences' tokens live in (so a free or a
// truncation waits for it), and when it appends it owns the slots its new
// tokens go to and the copy-on-write copies it must make first. The engine
// builds one per batch (one part per request), the determinism checker one per
// check, CacheManager::append one per AppendKV.
//
// Life: CacheManager::begin -> reserve (once per request, each all-or-nothing)
// -> finish (copies, K/V writes, commit; skipped when nothing is appended) ->
// the launch reads tables() -> release (or the destructor). A reservation
// released before it committed rolls back whole: no length changes.
// Buffers are kept across uses, so a warm caller allocates nothing.

#include <cstdint>
#include <mutex>
#include <span>
#include <vector>

#include "pagoda/paged_kv.h"

namespace pagoda {

using SequenceId = uint64_t;

class CacheManager;

class Reservation {
 public:
  // One request's share of the reservation.
  struct Part {
    int32_t first_sequence = 0;  // [first_sequence, end_sequence) of tables()
    int32_t end_sequence = 0;
    int32_t first_slot = 0;      // [first_slot, end_slot) of slots(): its new tokens
    int32_t end_slot = 0;
  };

  Reservation() = default;
  Reservation(Reservation&& other) noexcept;
  Reservation& operator=(Reservation&& other) noexcept;
  Reservation(const Reservation&) = delete;
  Reservation& operator=(const Reservation&) = delete;
  ~Reservation() { release(); }

  // Unpins everything (rolling back an append that did not commit) and empties
  // the reservation; its buffers stay allocated for the next use. Returns the
  // blocks that went back to the free list (a sequence freed meanwhile).
  int32_t release();

  bool active() const { return owner_ != nullptr; }
  int32_t layer() const { return layer_; }
  int32_t batch() const { return static_cast<int32_t>(lengths_.size()); }
  // Every sequence reserved so far, in order, with its length after the appends.
  BatchBlockTables tables() const {
    return {batch(), block_indptr_.data(), block_ids_.data(), lengths_.data()};
  }
  std::span<const int32_t> lengths() const { return lengths_; }
  std::span<const Part> parts() const { return parts_; }
  // Flat slots of the new tokens, part by part, sequence by sequence.
  std::span<const int64_t> slots() const { return slots_; }

 private:
  friend class CacheManager;
  // A copy-on-write copy this reservation makes before writing: `src` (pinned
  // until the copy is done) into `dst`, already entry `index` of the table of
  // sequence `id`.
  struct Copy {
    int32_t src;
    int32_t dst;
    SequenceId id;
    int32_t index;
    bool done;
  };
  // A sequence's layer length once this reservation commits.
  struct Growth {
    SequenceId id;
    int32_t length;
  };

  void clear();

  CacheManager* owner_ = nullptr;
  int32_t layer_ = 0;
  bool committed_ = false;
  std::unique_lock<std::mutex> writer_;  // the layer's writer token, held while appending
  std::vector<int32_t> lengths_;         // [batch]
  std::vector<int32_t> block_indptr_;    // [batch + 1]
  std::vector<int32_t> block_ids_;       // pinned
  std::vector<int64_t> slots_;
  std::vector<Part> parts_;
  std::vector<Copy> copies_;
  std::vector<Growth> growth_;
  std::vector<int32_t> awaited_;         // blocks another reservation is still filling
  std::vector<std::pair<int32_t, int32_t>> shares_taken_;  // scratch of reserve(): (block, copies planned)
};

}  // namespace pagoda
