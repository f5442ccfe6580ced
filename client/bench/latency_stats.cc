#include "latency_stats.h"

#include <algorithm>
#include <cmath>
#include <numeric>

namespace pagoda::bench {
namespace {

// Nearest rank: the smallest value with at least p of the samples at or below it.
double percentile(const std::vector<double>& sorted, double p) {
  const auto rank = static_cast<size_t>(std::ceil(p * static_cast<double>(sorted.size())));
  return sorted[std::clamp<size_t>(rank, 1, sorted.size()) - 1];
}

}  // namespace

LatencySummary summarize(std::vector<double>& latencies_us) {
  LatencySummary s;
  if (latencies_us.empty()) return s;
  std::sort(latencies_us.begin(), latencies_us.end());
  s.count = static_cast<int64_t>(latencies_us.size());
  s.mean_us = std::accumulate(latencies_us.begin(), latencies_us.end(), 0.0) / static_cast<double>(s.count);
  s.p50_us = percentile(latencies_us, 0.50);
  s.p90_us = percentile(latencies_us, 0.90);
  s.p99_us = percentile(latencies_us, 0.99);
  s.max_us = latencies_us.back();
  return s;
}

}  // namespace pagoda::bench
