#pragma once
// The in-process baseline of the service benchmark: a backend built in this
// process with the server's geometry (make_backend), filled with `batch`
// sequences of `context` tokens, timed on the same decode the service runs. The
// service's throughput divided by this one is the overhead ratio docs/design.md §7 asks
// for.

#include <cstdint>
#include <string>

#include "latency_stats.h"
#include "pagoda/client/error.h"
#include "pagoda/client/types.h"

namespace pagoda::bench {

struct InprocessShape {
  std::string backend = "cpu";  // the server's backend kind
  int32_t batch = 1;
  int32_t context = 128;
  int32_t q_len = 1;            // query rows per sequence
  int32_t window = 0;           // sliding window, 0: none
  int32_t threads = 0;          // backend threads (0 = all cores, as the server's default)
  double min_seconds = 0.5;     // time at least this long (and at least `min_iters` launches)
  int64_t min_iters = 20;
};

struct InprocessResult {
  int32_t context = 0;          // tokens per sequence it ran at
  LatencySummary latency;       // per launch
  double sequences_per_s = 0;   // batch / mean launch time
  double kv_bytes_per_s = 0;    // K/V bytes attended over / mean launch time
  std::string device;
};

client::Result<InprocessResult> measure_inprocess(const client::ServerConfig& config,
                                                  const InprocessShape& shape);

}  // namespace pagoda::bench
