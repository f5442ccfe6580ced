#pragma once
// Percentiles of a set of per-call latencies.

#include <cstdint>
#include <vector>

namespace pagoda::bench {

struct LatencySummary {
  int64_t count = 0;
  double mean_us = 0;
  double p50_us = 0;
  double p90_us = 0;
  double p99_us = 0;
  double max_us = 0;
};

// Nearest-rank percentiles; sorts `latencies_us` in place. All zeros when empty.
LatencySummary summarize(std::vector<double>& latencies_us);

}  // namespace pagoda::bench
