#include "cpu/nan_free_slots.h"

namespace pagoda::cpu {

NanFreeSlots::NanFreeSlots(const CacheGeometry& g) {
  if (g.dtype != DType::kFloat8E4M3) return;
  layers_ = g.num_layers;
  blocks_ = g.num_blocks;
  // Value-initialised: no slot is known NaN-free until it is written.
  marks_ = std::make_unique<std::atomic<int32_t>[]>(static_cast<size_t>(layers_ * blocks_));
}

void NanFreeSlots::wrote(int32_t layer, int32_t block, int32_t slot, bool nan) {
  if (!tracking()) return;
  std::atomic<int32_t>& m = mark(layer, block);
  int32_t seen = m.load(std::memory_order_relaxed);
  if (nan) {
    while (seen > slot && !m.compare_exchange_weak(seen, slot, std::memory_order_relaxed)) {
    }
  } else if (seen == slot) {
    m.compare_exchange_strong(seen, slot + 1, std::memory_order_relaxed);  // lost to a NaN write: its mark stays
  }
}

void NanFreeSlots::copied(int32_t src, int32_t dst) {
  if (!tracking()) return;
  for (int32_t layer = 0; layer < layers_; ++layer) {
    mark(layer, dst).store(mark(layer, src).load(std::memory_order_relaxed), std::memory_order_relaxed);
  }
}

void NanFreeSlots::poisoned(int32_t block) {
  if (!tracking()) return;
  for (int32_t layer = 0; layer < layers_; ++layer) mark(layer, block).store(0, std::memory_order_relaxed);
}

}  // namespace pagoda::cpu
