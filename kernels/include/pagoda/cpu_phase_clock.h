#pragma once
// Where the CPU kernel's time goes, phase by phase of its sub-blocks
// (`pagoda-bench kernel --phases`). The KVM guests this is tuned on expose no
// hardware counters (`perf stat` reports cycles as not supported), so the
// kernel can time itself: off, each phase edge is one untaken branch; on, each
// task reads the steady clock there and adds its totals once it ends. Either
// way no bit of a decode changes.

#include <array>
#include <cstdint>

namespace pagoda::cpu {

enum class KernelPhase : uint8_t {
  kScores,   // pass 1: q.k of every row over a sub-block's keys (with K's tiles or packing)
  kSoftmax,  // each row's max and weights over the sub-block
  kValues,   // pass 2: P.V (with V's tiles or packing, and the weights' packing)
  kMerge,    // the sub-block's states into the task's
  kOther,    // the task's set-up and the rest (states reset, q packed, ...)
};
inline constexpr int kKernelPhases = 5;

// Seconds in each phase, summed over the tasks that ended (so over threads:
// a launch on n threads can add up to n times its own time).
struct KernelPhaseTimes {
  std::array<double, kKernelPhases> seconds{};
  int64_t tasks = 0;

  double at(KernelPhase p) const { return seconds[static_cast<int>(p)]; }
  double total() const {
    double s = 0;
    for (const double x : seconds) s += x;
    return s;
  }
};

// Starts the clock from zero (on) or stops it, for every CPU backend of the
// process. Call between launches: a task running meanwhile may be counted in
// part or not at all.
void time_kernel_phases(bool on);

// Whether the clock runs.
bool kernel_phases_timed();

// The totals of the tasks that ended since the clock last started.
KernelPhaseTimes kernel_phase_times();

}  // namespace pagoda::cpu
