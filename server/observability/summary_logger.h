#pragma once
// The periodic summary log line (requests, errors, Decode p99, cache usage and the
// determinism checker's counts over the last interval), from its own thread.

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <thread>

#include "observability/metrics.h"

namespace pagoda {

// The determinism checker's counts since start, as the summary line shows them.
struct CheckCounts {
  uint64_t checked = 0;
  uint64_t mismatches = 0;
  uint64_t skipped = 0;
};

class SummaryLogger {
 public:
  // interval <= 0: no thread, no line. `checks` may be empty (no checker).
  SummaryLogger(Metrics& metrics, std::function<CheckCounts()> checks, std::chrono::duration<double> interval);
  SummaryLogger(const SummaryLogger&) = delete;
  SummaryLogger& operator=(const SummaryLogger&) = delete;
  ~SummaryLogger();  // stop()

  void stop();
  // Logs one summary line now (the thread's body; also for tests).
  void log_once();

 private:
  Metrics& metrics_;
  const std::function<CheckCounts()> checks_;
  const std::chrono::duration<double> interval_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool stopping_ = false;
  std::thread thread_;
};

}  // namespace pagoda
