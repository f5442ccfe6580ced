#include "observability/cache_gauges.h"

namespace pagoda {

void CacheGauges::publish() {
  std::lock_guard<std::mutex> lock(mu_);
  const int64_t free_blocks = cache_.free_blocks();
  metrics_.set_cache(cache_.total_blocks() - free_blocks, free_blocks, static_cast<int64_t>(cache_.num_sequences()));
  cache_.for_each_tenant([&](TenantId id, const TenantLimits& limits, const TenantUsage& usage) {
    metrics_.set_tenant_usage(id, limits.name, usage.blocks, usage.sequences);
  });
}

}  // namespace pagoda
