#pragma once
// Which slots of an e4m3 cache are known to hold no NaN code. e4m3 has one
// NaN code per sign (S.1111.111) and no infinity, and its fast widening reads
// a NaN code as a finite value, so the kernels scan a run before reading it
// that way (decode_reads_inl.h, readable_in_place). The service refuses non-finite
// K/V at append, so its cache never holds the code and the scan would find
// nothing on every run of every step. The backend keeps, per layer and block,
// how many leading slots are known NaN-free: a run inside them is read
// without the scan.
//
// A finite write to the first slot not known NaN-free moves the mark past it
// (appends fill a block slot by slot); a NaN code written anywhere pulls the
// mark back to its slot; a copy takes its source's marks and poisoning zeroes
// them. A finite write past the mark leaves it: the mark claims only what it
// has seen. A decode reads only slots below each sequence's length, all
// written before it was issued, so a write racing a decode (a later slot)
// never moves a mark below a slot that decode reads: relaxed atomics suffice.

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>

#include "pagoda/paged_kv.h"

namespace pagoda::cpu {

class NanFreeSlots {
 public:
  // Tracks an e4m3 cache's slots; for any other dtype it tracks nothing and
  // layer() is null (their widenings keep a NaN a NaN).
  explicit NanFreeSlots(const CacheGeometry& g);

  bool tracking() const { return marks_ != nullptr; }
  // [num_blocks] marks of one layer, or null when not tracking.
  const std::atomic<int32_t>* layer(int32_t layer) const {
    return tracking() ? marks_.get() + static_cast<int64_t>(layer) * blocks_ : nullptr;
  }

  // Slot `slot` of (layer, block) was written, all its heads, K and V: with a
  // NaN code among them or not.
  void wrote(int32_t layer, int32_t block, int32_t slot, bool nan);
  // Block dst now holds block src's bytes, every layer.
  void copied(int32_t src, int32_t dst);
  // Every slot of `block`, every layer, now holds NaN codes.
  void poisoned(int32_t block);

 private:
  std::atomic<int32_t>& mark(int32_t layer, int32_t block) const {
    return marks_[static_cast<size_t>(static_cast<int64_t>(layer) * blocks_ + block)];
  }

  int32_t layers_ = 0;
  int64_t blocks_ = 0;
  std::unique_ptr<std::atomic<int32_t>[]> marks_;  // [layers][blocks] leading NaN-free slots
};

// Whether rows [slot, slot + rows) of `block` are known NaN-free, given a
// layer's marks (null: nothing is known).
inline bool known_nan_free(const std::atomic<int32_t>* marks, int64_t block, int64_t slot, int64_t rows) {
  return marks != nullptr && marks[block].load(std::memory_order_relaxed) >= slot + rows;
}

}  // namespace pagoda::cpu
