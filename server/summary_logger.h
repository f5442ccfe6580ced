#pragma once
// The periodic summary log line (requests, errors, Decode p99, cache usage and the
// determinism checker's counts over the last interval), from its own thread.

#include <chrono>
#include <condition_variable>
#include <mutex>
#include <thread>

#include "metrics.h"

namespace pagoda {

class DeterminismChecker;

class SummaryLogger {
 public:
  // interval <= 0: no thread, no line. `checker` may be null.
  SummaryLogger(Metrics& metrics, const DeterminismChecker* checker, std::chrono::duration<double> interval);
  SummaryLogger(const SummaryLogger&) = delete;
  SummaryLogger& operator=(const SummaryLogger&) = delete;
  ~SummaryLogger();  // stop()

  void stop();
  // Logs one summary line now (the thread's body; also for tests).
  void log_once();

 private:
  Metrics& metrics_;
  const DeterminismChecker* checker_;
  const std::chrono::duration<double> interval_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool stopping_ = false;
  std::thread thread_;
};

}  // namespace pagoda
