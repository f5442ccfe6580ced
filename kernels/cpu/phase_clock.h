#pragma once
// The kernel's side of pagoda/cpu_phase_clock.h: a task's clock, which
// attributes the time between its marks to phases and adds its totals to the
// process's when the task ends.

#include <array>
#include <chrono>
#include <cstdint>

#include "pagoda/cpu_phase_clock.h"

namespace pagoda::cpu {

// Adds one task's nanoseconds per phase to the process's totals.
void add_task_phase_ns(const std::array<int64_t, kKernelPhases>& ns);

class PhaseTimer {
 public:
  // on: PartialTask::time_phases (the clock's state when the launch began).
  explicit PhaseTimer(bool on) : on_(on) {
    if (on_) last_ = now();
  }
  ~PhaseTimer() {
    if (!on_) return;
    mark(KernelPhase::kOther);
    add_task_phase_ns(ns_);
  }
  PhaseTimer(const PhaseTimer&) = delete;
  PhaseTimer& operator=(const PhaseTimer&) = delete;

  // The time since the previous mark (or the start) was spent in phase p.
  void mark(KernelPhase p) {
    if (!on_) return;
    const int64_t t = now();
    ns_[static_cast<int>(p)] += t - last_;
    last_ = t;
  }

 private:
  static int64_t now() {
    return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
        .count();
  }

  bool on_;
  int64_t last_ = 0;
  std::array<int64_t, kKernelPhases> ns_{};
};

}  // namespace pagoda::cpu
