// The prefetch levels of the CPU kernel's paths (prefetch_levels.h), and their
// selection (pagoda/cpu_targets.h).
#include "cpu/prefetch_levels.h"

#include <atomic>
#include <cstddef>
#include <string>
#include <utility>

#include "pagoda/cpu_targets.h"

namespace pagoda::cpu {
namespace {

// Measured on 2-vCPU AMD EPYC guests, 8 x 4096 tokens, head_dim 128, 2 threads:
// - Zen 4 (family 0x19): memory-bound tasks (FMA up to 8 rows, and the dot
//   products at every width) faster into L2: fp16 GQA 4 with one query row
//   8.9-9.7 ms against 9.3-12.6 with L1; bf16 dot products GQA 4 with four
//   rows 9.0-9.9 against 11.5-12.2, GQA 8 7.6-7.8 against 8.8-8.9. Wider FMA
//   tasks into L1 (16 rows: 18-21 ms against 27). Zen 3, the same family,
//   measured level with L1 everywhere (fp16 and e4m3 GQA 4 with one and four
//   query rows: 0.94-0.99x the time by median of 5 alternating runs; later
//   fp16 GQA 8 with one 0.93-1.02x by median of 8 and 10, and 0.99-1.01x on
//   one pinned thread, GQA 4 0.97-0.98x). Intel (Sapphire and
//   Emerald Rapids) was measured at 16 rows only, within 3% either way, and
//   the tiles with L1: it keeps these levels.
// - Zen 5 (family 0x1A): L1 everywhere, medians of three alternating runs:
//   fp16 GQA 4 one row 2.81 ms against 3.05 (L2), GQA 8 3.70 against 3.97; bf16
//   on the dot products GQA 4 one row 3.40 against 4.25, four rows 5.35 against
//   6.24, GQA 8 2.06 against 2.39; latent attention and fp8 level.
constexpr PrefetchLevels kMemoryBoundToL2{};

// The selection by name; "auto" follows auto_prefetch_levels of this CPU.
enum class Choice : uint8_t { kAuto, kL1, kL2 };
std::atomic<Choice> g_choice{Choice::kAuto};

const char* name(PrefetchLevel l) { return l == PrefetchLevel::kL1 ? "L1" : "L2"; }

// "<value> (<path>, <path>), <value> (<path>)": each value once, in the order
// the paths first take it, followed by the paths that take it. value_name(v,
// first) spells a value (first: the list's first).
template <typename V, size_t N, typename ValueName>
std::string group_by_value(const std::pair<V, const char*> (&paths)[N], ValueName value_name) {
  std::string out;
  for (size_t i = 0; i < N; ++i) {
    bool seen = false;
    for (size_t j = 0; j < i; ++j) seen = seen || paths[j].first == paths[i].first;
    if (seen) continue;
    std::string which;
    for (size_t j = i; j < N; ++j) {
      if (paths[j].first == paths[i].first) which += (which.empty() ? "" : ", ") + std::string(paths[j].second);
    }
    out += (out.empty() ? "" : ", ") + value_name(paths[i].first, out.empty()) + " (" + which + ")";
  }
  return out;
}

}  // namespace

PrefetchLevels auto_prefetch_levels(CpuFamily cpu) {
  return zen5_or_later(cpu) ? kAllL1 : kMemoryBoundToL2;
}

// Zen 5, lines to L1, medians of paired alternating runs against 32 rows (8 x
// 4096 tokens, head_dim 128, 2 threads): the FMAs' fp16 GQA 4 with one query
// row 0.93x the time at 48 rows (0.93x at 64), GQA 8 0.955x, e5m2 0.96x,
// head_dim 64 and GQA 1 level (0.98-1.0x); 64 rows against 48 later measured
// level on every unit (one query row: fp16 GQA 4 1.00x, GQA 8 1.00x, AVX2
// 1.01x, bf16 and e4m3 on the dot products 0.97x and 0.98x, 5 runs each). The
// FMAs' 16-row tasks measured level once, then in two later sets of 6 and 8
// runs fp16 GQA 4 with four query rows 0.975-0.977x in deterministic mode and
// 0.954-0.956x in fast mode, GQA 8 with four 0.971-0.986x, AVX2 GQA 4 with four
// 0.973x, latent attention (32 heads) 0.979x (5 runs; at 64 rows GQA 8 0.98x,
// AVX2 1.02x, latent attention 1.02x); one pinned thread from memory, GQA 4
// with four, 0.965x at 64 rows. The dot products' bf16 GQA 4 with one row
// 0.89x, GQA 8 0.94x; their 16-row tasks stay at 32: bf16 GQA 4 with four 1.03x
// and 1.05x at 48, e4m3 1.01x, latent attention 1.016x. Zen 4 and Intel, lines
// to L2 for the few-row tasks, keep 32 rows (measured best between 24 and 48
// there), and so does Zen 3 (AVX2, 8 x 4096 tokens, 2 threads, one query row,
// medians of 8 alternating runs against 32 rows: fp16 GQA 4 1.04x the time at
// 48 rows and 1.03x at 64, e4m3 1.08x and 1.04x (by minimum 0.88x and 0.85x:
// the host's memory was that noisy), GQA 1 1.02x at 48, head_dim 64 1.02x at
// 64 and 1.09x at 96).
PrefetchDistance auto_prefetch_distance(CpuFamily cpu) {
  if (zen5_or_later(cpu)) return {48, 48, 32};
  return {};
}

PrefetchDistance prefetch_distance() {
  static const PrefetchDistance here = auto_prefetch_distance(this_cpu_family());
  return here;
}

PrefetchLevels prefetch_levels() {
  switch (g_choice.load(std::memory_order_relaxed)) {
    case Choice::kL1: return kAllL1;
    case Choice::kL2: return kAllL2;
    case Choice::kAuto: break;
  }
  static const PrefetchLevels here = auto_prefetch_levels(this_cpu_family());
  return here;
}

std::string describe(const PrefetchLevels& levels) {
  if (levels == kAllL1) return "L1";
  if (levels == kAllL2) return "L2";
  const std::string few = "FMA to " + std::to_string(kFewPrefetchRows) + " rows";
  const std::pair<PrefetchLevel, const char*> paths[] = {{levels.fma_few_rows, few.c_str()},
                                                         {levels.fma_many_rows, "wider FMA"},
                                                         {levels.bf16_dot, "dot products"},
                                                         {levels.amx, "tiles"}};
  return group_by_value(paths, [](PrefetchLevel l, bool) { return std::string(name(l)); });
}

Status select_prefetch_level(const std::string& level) {
  if (level == "auto") {
    g_choice = Choice::kAuto;
  } else if (level == "l1") {
    g_choice = Choice::kL1;
  } else if (level == "l2") {
    g_choice = Choice::kL2;
  } else {
    return InvalidArgument("prefetch: expected auto, l1 or l2, received '{}'", level);
  }
  return Status::Ok();
}

std::string prefetch_level_name() { return describe(prefetch_levels()); }

std::string describe(const PrefetchDistance& d) {
  const std::string few = "tasks of up to " + std::to_string(kFewPrefetchRows) + " rows";
  const std::pair<int32_t, const char*> paths[] = {
      {d.few_rows, few.c_str()}, {d.many_rows, "wider FMA tasks"}, {d.many_rows_on_units, "wider matrix-unit tasks"}};
  if (d.few_rows == d.many_rows && d.many_rows == d.many_rows_on_units) {
    return std::to_string(d.few_rows) + " rows ahead";
  }
  return group_by_value(paths, [](int32_t rows, bool first) {
    return std::to_string(rows) + (first ? " rows ahead" : "");
  });
}

std::string prefetch_distance_name() { return describe(prefetch_distance()); }

}  // namespace pagoda::cpu
