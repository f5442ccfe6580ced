#pragma once
// A consistent cut of one sequence (an export, a snapshot): its label, tenant
// and committed per-layer lengths at one instant, and the blocks those tokens
// live in, pinned as a reservation pins them (cache_manager.h). Appends,
// truncations and frees after the cut neither wait for it nor change the
// bytes it reads; the pins go when it is released or destroyed.

#include <cstdint>
#include <string>
#include <vector>

#include "cache/reservation.h"
#include "cache/tenant.h"

namespace pagoda {

class SequenceCut {
 public:
  SequenceCut() = default;
  SequenceCut(const SequenceCut&) = delete;
  SequenceCut& operator=(const SequenceCut&) = delete;
  ~SequenceCut() { release(); }

  void release();
  bool active() const { return owner_ != nullptr; }

  SequenceId id = 0;
  TenantId tenant = kDefaultTenant;
  std::string label;
  std::vector<int32_t> lengths;  // [num_layers] committed at the cut
  std::vector<int32_t> blocks;   // pinned: the table's first blocks, enough for the longest layer
  int32_t block_size = 0;

  // Flat slots of tokens [first, end) (any layer: a block id addresses every layer).
  void slots(int32_t first, int32_t end, std::vector<int64_t>& out) const;

 private:
  friend class CacheManager;
  CacheManager* owner_ = nullptr;
};

}  // namespace pagoda
