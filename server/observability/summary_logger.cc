#include "observability/summary_logger.h"

#include <spdlog/spdlog.h>

namespace pagoda {

SummaryLogger::SummaryLogger(Metrics& metrics, std::function<CheckCounts()> checks,
                             std::chrono::duration<double> interval)
    : metrics_(metrics), checks_(std::move(checks)), interval_(interval) {
  if (interval_.count() <= 0) return;
  thread_ = std::thread([this] {
    std::unique_lock<std::mutex> lock(mu_);
    const auto period = std::chrono::duration_cast<std::chrono::steady_clock::duration>(interval_);
    auto next = std::chrono::steady_clock::now() + period;
    while (!cv_.wait_until(lock, next, [this] { return stopping_; })) {
      lock.unlock();
      log_once();
      lock.lock();
      next += period;
    }
  });
}

SummaryLogger::~SummaryLogger() { stop(); }

void SummaryLogger::stop() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

void SummaryLogger::log_once() {
  const MetricsSummary s = metrics_.summary_since_last();
  const CheckCounts checks = checks_ ? checks_() : CheckCounts{};
  spdlog::info("summary: {} requests ({} errors) in {:.1f} s, decode p99 {:.1f} us, kv usage {:.1f}%, {} sequences, "
               "determinism checks {} (mismatches {}, skipped {}) since start",
               s.requests, s.errors, s.interval_seconds, s.decode_p99_seconds * 1e6, s.kv_usage_ratio * 100,
               s.sequences, checks.checked, checks.mismatches, checks.skipped);
}

}  // namespace pagoda
