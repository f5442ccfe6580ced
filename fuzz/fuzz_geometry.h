#pragma once
// The geometry both fuzz targets validate requests against (the server's
// defaults: 2 layers, 8 query and 2 KV heads of 64, blocks of 16, fp16).

#include "pagoda/paged_kv.h"
#include "rpc/service_settings.h"

namespace pagoda::fuzz {

inline CacheGeometry fuzz_geometry() {
  CacheGeometry g;
  g.num_layers = 2;
  g.num_q_heads = 8;
  g.num_kv_heads = 2;
  g.head_dim = 64;
  g.block_size = 16;
  g.num_blocks = 1024;
  g.dtype = DType::kFloat16;
  return g;
}

inline constexpr int32_t kFuzzMaxBatch = 64;

// The service's settings around that geometry, as admission sees them.
inline ServiceSettings fuzz_settings() {
  ServiceSettings s;
  s.geometry = fuzz_geometry();
  s.max_batch = kFuzzMaxBatch;
  return s;
}

}  // namespace pagoda::fuzz
