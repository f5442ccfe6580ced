#include "app/idle_sweeper.h"

#include <algorithm>

#include <spdlog/spdlog.h>

#include "cache/cache_manager.h"
#include "observability/metrics.h"

namespace pagoda {

IdleSweeper::IdleSweeper(CacheManager& cache, Metrics& metrics, std::chrono::duration<double> ttl)
    : cache_(cache),
      metrics_(metrics),
      ttl_(std::chrono::duration_cast<std::chrono::steady_clock::duration>(ttl)),
      thread_([this] { run(); }) {}

IdleSweeper::~IdleSweeper() { stop(); }

void IdleSweeper::stop() {
  {
    std::lock_guard lock(mu_);
    stopping_ = true;
  }
  wake_.notify_all();
  if (thread_.joinable()) thread_.join();
}

void IdleSweeper::run() {
  const auto period = std::clamp<std::chrono::steady_clock::duration>(ttl_ / 4, std::chrono::milliseconds(10),
                                                                      std::chrono::seconds(1));
  std::unique_lock lock(mu_);
  while (!wake_.wait_for(lock, period, [this] { return stopping_; })) {
    lock.unlock();
    const std::vector<CacheManager::Evicted> evicted = cache_.evict_idle(ttl_);
    for (const auto& e : evicted) {
      spdlog::info("idle-ttl: freed sequence {} ('{}') unused for {:.1f} s", e.id, e.label, e.idle_seconds);
    }
    if (!evicted.empty()) metrics_.add_sequences_evicted(static_cast<int64_t>(evicted.size()));
    lock.lock();
  }
}

}  // namespace pagoda
