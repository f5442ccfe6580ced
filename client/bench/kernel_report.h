#pragma once
// pagoda-bench kernel's figures and how they are printed (table or JSON). Each
// row is a ratio of two figures measured in the same run: K/V bytes read per
// second over the read bandwidth, and over the roofline min(read bandwidth,
// FMA peak / FLOPs per K/V byte).

#include <cstdint>
#include <string>
#include <vector>

#include "pagoda/paged_kv.h"

namespace pagoda::bench {

struct KernelRow {
  std::string target;      // SIMD target that ran (CPU), or "cuda"
  int32_t context = 0;
  int32_t q_len = 1;       // query rows per sequence (DESIGN §9)
  int32_t window = 0;      // sliding window, 0: none
  std::string mode;
  int32_t chunk_tokens = 0;
  double kernel_s = 0;     // median attention time of one launch
  double kv_bytes = 0;     // K/V bytes one launch must read: the keys its rows attend
  double baseline = 0;     // read bandwidth measured in this run, bytes/s
  double fma_peak = 0;     // FLOP/s of a register-resident FMA loop on the same threads (CPU), 0 if not measured
  double naive_s = 0;      // naive path on the same inputs, 0 if not run

  double bandwidth() const { return kv_bytes / kernel_s; }
};

struct KernelReport {
  std::string backend;
  std::string device;
  CacheGeometry geometry;
  int32_t batch = 0;
  int32_t split_tokens = 0;
  int32_t threads = 0;
  std::vector<KernelRow> rows;

  // Multiply-adds of q.k and p.v per K/V byte: 4 * group * head_dim FLOPs per
  // token, KV head and query row over 2 * head_dim elements of K and V (a
  // bound: with q_len > 1 the earliest rows attend a few keys fewer).
  double flops_per_byte(const KernelRow& r) const {
    return 2.0 * geometry.group_size() * r.q_len / static_cast<double>(dtype_size(geometry.dtype));
  }
  // The limit a row's bandwidth is compared with, and what sets it.
  double roofline(const KernelRow& r) const;
  const char* bound(const KernelRow& r) const;
};

void print_table(const KernelReport& report);
void print_json(const KernelReport& report);

}  // namespace pagoda::bench
