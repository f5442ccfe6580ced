#pragma once
// Publishes the cache's occupancy (used/free blocks, usage ratio, live sequences) to
// the metrics after each change. Reading the cache and setting the gauges happen
// under one lock, so that concurrent publishers cannot leave an older reading last.

#include <mutex>

#include "cache/cache_manager.h"
#include "observability/metrics.h"

namespace pagoda {

class CacheGauges {
 public:
  CacheGauges(const CacheManager& cache, Metrics& metrics) : cache_(cache), metrics_(metrics) {}

  // Call after anything that may change the cache's blocks or sequences.
  void publish();

 private:
  const CacheManager& cache_;
  Metrics& metrics_;
  std::mutex mu_;
};

}  // namespace pagoda
