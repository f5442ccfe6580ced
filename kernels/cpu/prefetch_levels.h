#pragma once
// Where the CPU kernel's tasks put the K/V lines they request ahead of their
// reads (LinePrefetch, decode_tiles.h): per path, chosen once per process.
// Which level keeps the memory busiest depends on the core: how many misses
// it keeps in flight to each level, and whether its loads wait on L2. The
// level changes no bits, only where a line waits.

#include <cstdint>
#include <string>

#include "cpu/cpu_family.h"

namespace pagoda::cpu {

enum class PrefetchLevel : uint8_t { kL1, kL2 };

// FMA-path tasks of up to this many rows are the "few rows" ones: bound by
// memory, not by their multiplies.
inline constexpr int32_t kFewPrefetchRows = 8;

// A task of few rows per K/V element is bound by memory: where a core keeps
// more requests in flight to L2 than into L1, its lines go to L2 (prefetcht1
// on x86) and the compute loops' own loads find them one level down. A task
// of many rows is bound by its multiplies, which should not wait on L2: its
// lines go to L1 (prefetcht0). The defaults are "auto" for every CPU but AMD
// Zen 5 (auto_prefetch_levels).
struct PrefetchLevels {
  PrefetchLevel fma_few_rows = PrefetchLevel::kL2;   // FMA tasks of up to kFewPrefetchRows rows
  PrefetchLevel fma_many_rows = PrefetchLevel::kL1;  // wider FMA tasks
  PrefetchLevel bf16_dot = PrefetchLevel::kL2;       // the AVX512-BF16 dot products, any width
  PrefetchLevel amx = PrefetchLevel::kL1;            // the AMX tiles, any width

  PrefetchLevel fma(int32_t rows) const { return rows <= kFewPrefetchRows ? fma_few_rows : fma_many_rows; }
  bool operator==(const PrefetchLevels&) const = default;
};

// Every path at one level: the "l1" and "l2" selections.
inline constexpr PrefetchLevels kAllL1{PrefetchLevel::kL1, PrefetchLevel::kL1, PrefetchLevel::kL1,
                                       PrefetchLevel::kL1};
inline constexpr PrefetchLevels kAllL2{PrefetchLevel::kL2, PrefetchLevel::kL2, PrefetchLevel::kL2,
                                       PrefetchLevel::kL2};

// The levels measured faster on a CPU family ("auto").
PrefetchLevels auto_prefetch_levels(CpuFamily cpu);

// How far ahead of its reads a task requests lines, in rows: tasks of up to
// kFewPrefetchRows rows (memory-bound on any unit), wider tasks on the FMAs,
// and wider tasks on a matrix unit (AVX512-BF16 dot products, AMX tiles),
// whose multiplies take far less time per row. Like the level, it changes no
// bits.
struct PrefetchDistance {
  int32_t few_rows = 32;   // 8 KiB of fp16 rows at head_dim 128
  int32_t many_rows = 32;  // wider FMA tasks
  int32_t many_rows_on_units = 32;

  // An FMA task's distance, and a matrix-unit task's.
  int64_t rows(int32_t task_rows) const { return task_rows <= kFewPrefetchRows ? few_rows : many_rows; }
  int64_t unit_rows(int32_t task_rows) const {
    return task_rows <= kFewPrefetchRows ? few_rows : many_rows_on_units;
  }
  bool operator==(const PrefetchDistance&) const = default;
};

// The distance measured best on a CPU family, and this CPU's (once per process).
PrefetchDistance auto_prefetch_distance(CpuFamily cpu);
PrefetchDistance prefetch_distance();

// "32 rows ahead", or per path where they differ, e.g. "48 rows ahead (tasks
// of up to 8 rows, wider FMA tasks), 32 (wider matrix-unit tasks)".
std::string describe(const PrefetchDistance& d);

// The levels in force (select_prefetch_level in pagoda/cpu_targets.h).
PrefetchLevels prefetch_levels();

// "L1", "L2", or per path where they differ, e.g. "L2 (FMA to 8 rows, dot
// products), L1 (wider FMA, tiles)".
std::string describe(const PrefetchLevels& levels);

}  // namespace pagoda::cpu
