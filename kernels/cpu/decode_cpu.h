#pragma once
// The CPU split-KV kernel for one work item: the partial online-softmax states of
// all query heads of one KV head's group over one chunk of one sequence. SIMD
// through Highway, dispatched at run time to the best target of the machine.

#include <cstdint>

#include "pagoda/dtype.h"
#include "pagoda/paged_kv.h"

namespace pagoda::cpu {

struct PartialTask {
  const CacheGeometry* geometry = nullptr;
  const void* k_layer = nullptr;      // K pool at this layer: [num_blocks][kv_heads][block_size][head_dim]
  const void* v_layer = nullptr;      // V pool at this layer, same layout
  const int32_t* blocks = nullptr;    // the sequence's block table
  int64_t begin = 0;                  // first token of the chunk
  int64_t end = 0;                    // one past its last token (<= sequence length)
  int32_t kv_head = 0;
  const float* q = nullptr;           // [group, head_dim] fp32, already scaled by scale * log2(e)
  float* m = nullptr;                 // [group] out: running max, base 2
  float* l = nullptr;                 // [group] out: sum of 2^(s - m)
  float* acc = nullptr;               // [group, head_dim] out: sum of 2^(s - m) * v
};

void compute_partial(const PartialTask& task);

// Name of the SIMD target the dispatcher runs on this machine (for logs/benches).
const char* simd_target_name();

}  // namespace pagoda::cpu
