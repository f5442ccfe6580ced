#include "cpu/phase_clock.h"

#include <atomic>

namespace pagoda::cpu {
namespace {

// Each task adds once, when it ends: a few hundred relaxed adds a launch.
struct Totals {
  std::atomic<bool> on{false};
  std::array<std::atomic<int64_t>, kKernelPhases> ns{};
  std::atomic<int64_t> tasks{0};
};

Totals& totals() {
  static Totals t;
  return t;
}

}  // namespace

void add_task_phase_ns(const std::array<int64_t, kKernelPhases>& ns) {
  Totals& t = totals();
  for (int p = 0; p < kKernelPhases; ++p) t.ns[p].fetch_add(ns[p], std::memory_order_relaxed);
  t.tasks.fetch_add(1, std::memory_order_relaxed);
}

void time_kernel_phases(bool on) {
  Totals& t = totals();
  if (on) {
    for (auto& ns : t.ns) ns.store(0, std::memory_order_relaxed);
    t.tasks.store(0, std::memory_order_relaxed);
  }
  t.on.store(on, std::memory_order_release);
}

bool kernel_phases_timed() { return totals().on.load(std::memory_order_acquire); }

KernelPhaseTimes kernel_phase_times() {
  const Totals& t = totals();
  KernelPhaseTimes out;
  for (int p = 0; p < kKernelPhases; ++p) out.seconds[p] = static_cast<double>(t.ns[p].load()) * 1e-9;
  out.tasks = t.tasks.load();
  return out;
}

}  // namespace pagoda::cpu
