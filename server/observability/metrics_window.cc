#include "observability/metrics_window.h"

#include <algorithm>
#include <cmath>
#include <limits>

namespace pagoda {

WindowedMax::WindowedMax(Clock::duration window)
    : slot_length_(std::max<Clock::duration>(window / kSlots, Clock::duration(1))) {}

int64_t WindowedMax::slot_index(Clock::time_point now) const {
  return static_cast<int64_t>(now.time_since_epoch() / slot_length_);
}

void WindowedMax::record(double value, Clock::time_point now) {
  const int64_t index = slot_index(now);
  std::lock_guard lock(mutex_);
  Slot& slot = slots_[static_cast<std::size_t>(index % kSlots)];
  if (slot.index != index) slot = Slot{index, 0};
  // A NaN difference must not hide: it counts as the largest possible.
  slot.max = std::isnan(value) ? std::numeric_limits<double>::infinity() : std::max(slot.max, value);
}

double WindowedMax::max(Clock::time_point now) const {
  const int64_t newest = slot_index(now);
  std::lock_guard lock(mutex_);
  double result = 0;
  for (const Slot& slot : slots_) {
    if (slot.index > newest - kSlots && slot.index <= newest) result = std::max(result, slot.max);
  }
  return result;
}

}  // namespace pagoda
