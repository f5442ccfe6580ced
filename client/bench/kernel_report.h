#pragma once
// pagoda-bench kernel's figures and how they are printed (table or JSON). Each
// row is a ratio of two figures measured in the same run: K/V bytes read per
// second over the read bandwidth, and over the roofline min(read bandwidth,
// FMA peak / FLOPs per K/V byte).

#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "pagoda/cpu_phase_clock.h"
#include "pagoda/dtype.h"
#include "pagoda/paged_kv.h"

namespace pagoda::bench {

struct KernelRow {
  DType dtype = DType::kFloat16;  // the cache's
  std::string selection;   // the --target asked for (best, avx2, ...): rows of two dtypes compare under it
  std::string target;      // SIMD target that ran (CPU), or "cuda"
  std::string prefetch;    // the CPU's prefetch selection: auto, l1 or l2 ("" for CUDA)
  int32_t context = 0;
  int32_t q_len = 1;       // query rows per sequence (docs/design.md, "Attention variants")
  int32_t window = 0;      // sliding window, 0: none
  int32_t shared_prefix = 0;  // tokens every sequence shares with the first (forks of one parent); 0: none
  std::string mode;
  int32_t chunk_tokens = 0;
  double kernel_s = 0;     // median attention time of one launch
  double kv_bytes = 0;     // K/V bytes one launch reads (the plan's count: a shared chunk once)
  double flops = 0;        // multiply-adds of q.k and p.v of one launch, 2 FLOPs each
  double baseline = 0;     // read bandwidth measured in this run, bytes/s
  double compute_peak = 0;     // FLOP/s of the compute unit's register-resident loop on the same threads (CPU), 0 if not measured
  std::string compute = "fma";  // which unit compute_peak measures: "fma" (fp32 FMAs), "amx" (bf16 tile multiplies) or "bf16dot" (AVX512-BF16 dot products)
  double naive_s = 0;      // naive path on the same inputs, 0 if not run
  double unshared_s = 0;   // shared_prefix > 0: the same batch with unshared twins, median of one launch
  // --phases (CPU): one launch's seconds in each kernel phase, summed over its
  // tasks (so over the threads), from launches of its own after the timed ones.
  bool phases_timed = false;
  cpu::KernelPhaseTimes phases;

  double bandwidth() const { return kv_bytes / kernel_s; }
};

struct KernelReport {
  std::string backend;
  std::string device;
  CacheGeometry geometry;  // the first dtype's; the others differ in dtype alone
  std::vector<DType> dtypes;  // in the order timed
  int32_t batch = 0;
  int32_t split_tokens = 0;
  int32_t threads = 0;
  std::string prefetch_auto;  // what "auto" resolves to on this CPU ("" for CUDA)
  std::vector<KernelRow> rows;

  // The least time a launch can take: its bytes at the read bandwidth or its
  // FLOPs at the FMA peak, whichever is longer; that one is its bound.
  double roofline_seconds(const KernelRow& r) const;
  const char* bound(const KernelRow& r) const;
  double fraction_of_roofline(const KernelRow& r) const { return roofline_seconds(r) / r.kernel_s; }
  // A row of several query rows per sequence: its time over the same dtype,
  // requested target (which with the dtype fixes the kernel), prefetch,
  // context, window, sharing and mode with one (0: no such row).
  double time_over_one_row(const KernelRow& r) const;
  // A row of a later dtype: its time over the first dtype's row of the same
  // requested target, prefetch, context, q_len, window, sharing and mode (0:
  // none, or the first dtype's own row).
  double time_over_first_dtype(const KernelRow& r) const;
  // --phases: the multiply-adds of q.k (kScores) or of p.v (kValues) at one
  // thread's share of the compute peak, over the phase's time (0: not timed).
  double phase_of_peak(const KernelRow& r, cpu::KernelPhase p) const;
};

void print_table(const KernelReport& report);
void print_json(const KernelReport& report);
// One Markdown table row per launch, appended to `out` (--summary): ISA, shape,
// dtype, query rows, mode, bound, fraction of the roofline and of the read,
// time over one query row's and over the first dtype's. `header`: the file is
// new, so the device and the table's header go first. Several runs of the
// benchmark append to one file, so `make bench` ends in one table.
void append_summary(const KernelReport& report, std::FILE* out, bool header);

}  // namespace pagoda::bench
