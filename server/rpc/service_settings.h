#pragma once
// The settings requests are admitted against (rpc/admission.h) and GetConfig
// reports. Plain values, no gRPC: the fuzzers build them too.

#include <cstdint>
#include <vector>

#include "pagoda/backend.h"
#include "pagoda/paged_kv.h"
#include "pagoda/split_plan.h"

namespace pagoda {

// What the service validates requests against and reports in GetConfig.
struct ServiceSettings {
  CacheGeometry geometry;
  SplitMode mode = SplitMode::kDeterministic;
  int32_t split_tokens = 512;
  int32_t max_batch = 256;
  int64_t max_batch_wait_us = 50;
  int64_t max_message_bytes = int64_t{64} << 20;
  int32_t max_label_bytes = 256;
  int32_t max_request_tokens = 65536;
  int64_t max_request_blocks = 0;  // enforced by the cache manager; reported here
  int32_t max_stream_in_flight = 64;
  double idle_ttl = 0;             // enforced by the idle sweeper; reported here
  bool tls = false;                // reported in GetConfig
  int64_t max_sequences = 0;       // enforced by the cache manager; reported here
  int64_t max_sequence_tokens = 0; // enforced by the cache manager; reported here
  std::vector<KvScale> kv_scales;  // [num_layers] K/V scales (empty: 1.0): the range a 16-bit cache holds

  KvScale kv_scale(int32_t layer) const {
    return kv_scales.empty() ? KvScale{} : kv_scales[static_cast<size_t>(layer)];
  }
};

}  // namespace pagoda
