#pragma once
// The largest value recorded over a recent time window, for the
// pagoda_determinism_max_abs_diff gauge. A plain gauge set at each check would keep
// showing an old difference forever once checks stop; this one forgets it.
//
// Window: the last `window` of time, kept as kSlots slots of window/kSlots each, so
// a value stays visible for between window*(kSlots-1)/kSlots and `window` after it
// was recorded. With no value in the window the maximum is 0.

#include <array>
#include <chrono>
#include <cstdint>
#include <mutex>

namespace pagoda {

class WindowedMax {
 public:
  using Clock = std::chrono::steady_clock;
  static constexpr int kSlots = 6;

  explicit WindowedMax(Clock::duration window);

  void record(double value, Clock::time_point now);
  double max(Clock::time_point now) const;

 private:
  int64_t slot_index(Clock::time_point now) const;

  struct Slot {
    int64_t index = -1;  // which slot-length interval since the epoch this slot holds
    double max = 0;
  };
  Clock::duration slot_length_;
  mutable std::mutex mutex_;
  std::array<Slot, kSlots> slots_{};
};

}  // namespace pagoda
