#pragma once
// What the server's periodic summary log line reports, computed from the same
// histograms Prometheus scrapes, so the log and the dashboard agree.

#include <cstdint>
#include <span>

namespace pagoda {

struct MetricsSummary {
  double interval_seconds = 0;  // since the previous summary (or since start)
  uint64_t requests = 0;        // finished calls of every method in the interval
  uint64_t errors = 0;          // of which not OK
  double decode_p99_seconds = 0;  // Decode and DecodeStream, OK, in the interval; 0 without calls
  double kv_usage_ratio = 0;    // now
  int64_t sequences = 0;        // now
};

// The q-quantile (0..1) of observations counted per bucket, interpolated linearly inside
// the bucket that holds it, as PromQL's histogram_quantile does. `upper_bounds` are the
// finite bucket bounds in increasing order; `counts` has one more entry (the +Inf bucket)
// and is NOT cumulative. A quantile in the +Inf bucket is the largest finite bound.
// 0 when there is no observation.
double bucket_quantile(double q, std::span<const double> upper_bounds,  // [buckets]
                       std::span<const double> counts);                 // [buckets + 1]

}  // namespace pagoda
