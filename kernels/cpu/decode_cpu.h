#pragma once
// The CPU split-KV kernel for one work item: the partial online-softmax states of
// a group of query rows (every query head of one KV head, for one or more query
// positions of one sequence) over one chunk of that sequence's keys. SIMD
// through Highway, dispatched at run time to the best target of the machine (or
// the one select_simd_target chose).
//
// Each K and V byte of the chunk is read once and used by every row: scores
// come from a register-blocked micro-kernel (several rows x four tokens per
// step, no horizontal sum per token), the softmax runs in two passes over
// sub-blocks of kSubBlockTokens (no running rescale inside a sub-block), and
// P.V broadcasts each row's weight against one loaded V vector. Sub-block
// states merge with the one merge of pagoda/softmax_state.h.
//
// Bits: a row's state depends only on its own keys and their positions. Lanes
// are anchored to absolute positions, and each row loops over exactly its own
// key range, so a row computed with other rows (a batch, several query
// positions, another thread) has the bits it has alone; in fast mode
// (batch_invariant false) a task of many rows may score them in another order.

#include <atomic>
#include <cstdint>
#include <string>

#include "cpu/prefetch_levels.h"
#include "pagoda/dtype.h"
#include "pagoda/key_ranges.h"
#include "pagoda/paged_kv.h"
#include "pagoda/cpu_targets.h"
#include "pagoda/status.h"

namespace pagoda::cpu {

// Cache elements of the fp8 dtypes as the kernel's element types: one byte of
// bits each (Highway has no fp8 type), widened in registers by load_f32.
struct Fp8E4M3Bits {
  uint8_t bits;
};
struct Fp8E5M2Bits {
  uint8_t bits;
};
// e4m3 elements of rows known to hold no NaN code (the kernel scans a run
// before it reads it so): widened without the NaN step.
struct Fp8E4M3FiniteBits {
  uint8_t bits;
};

// What load_f32 of an fp8 element yields, times the stored value: e4m3 is
// widened through fp16 bit patterns that read 2^-8 of it, so launches fold
// 2^8 into the K and V scales.
inline float fp8_read_factor(DType t) { return t == DType::kFloat8E4M3 ? 256.f : 1.f; }

// One query position of a task (a query row of some sequence): its q, its keys
// and where its partial states go. The task's heads follow each other.
struct TaskPosition {
  const float* q = nullptr;  // q of (this position, the task's first head), fp32, scaled; heads head_dim apart
  KeySpan keys;              // keys it attends, absolute positions
  int64_t partial = 0;       // state index of (this position, the task's first head); heads follow
};

struct PartialTask {
  const CacheGeometry* geometry = nullptr;
  const void* k_layer = nullptr;      // K pool at this layer: [num_blocks][kv_heads][block_size][head_dim]
  // V pool at this layer, same layout; under latent attention the K pool
  // itself, of whose rows the first v_head_dim elements are V.
  const void* v_layer = nullptr;
  const int32_t* blocks = nullptr;    // a block table holding the chunk (every position's: they are equal there)
  // An e4m3 cache's marks at this layer: per block, its leading slots known to
  // hold no NaN code (nan_free_slots.h); null: none known, every run scanned.
  const std::atomic<int32_t>* nan_free = nullptr;
  int32_t kv_head = 0;
  int64_t chunk_begin = 0;            // first position of the chunk (a multiple of the split length)
  int64_t chunk_end = 0;              // one past its last position

  // Rows: positions x heads, position-major: row (p, h) is query head h of
  // position p. Positions may come from several sequences (a shared chunk).
  int32_t positions = 1;
  int32_t heads = 1;
  const TaskPosition* position = nullptr;  // [positions]
  // Deterministic mode: a row's bits may not depend on the task's other rows
  // (a draft row has the bits of its single-step decode), so the score order
  // is the group's. Fast mode (false) lets the rows choose it.
  bool batch_invariant = true;
  // 0: q is scaled by scale * log2(e) and scores are used as they are.
  // c > 0: q is scaled by scale, and each score s becomes c * tanh(s / c) * log2(e).
  float soft_cap = 0.f;
  // The bf16 cache's matrix unit (matrix_unit_for in pagoda/cpu_targets.h):
  // with one, q is as given (not scaled) and each score is multiplied by
  // score_scale after the bf16 multiply, so a q that is bf16 on the wire
  // reaches the unit exactly.
  MatrixUnit unit = MatrixUnit::kNone;
  float score_scale = 1.f;
  // An fp8 cache widened through byte tables (fp8_tables_serve in
  // pagoda/cpu_targets.h): the same values as load_f32's, in fewer instructions.
  bool fp8_tables = false;
  // An fp16 cache shared by many row blocks (AVX-512's quad scores, AVX2's
  // tasks of 9 to 16 rows), and on AVX2 an fp8 cache past 4 rows, is read
  // through an fp32 tile widened once (fp16_shared_through_tile of this CPU's
  // family), not in place or from its fp16 tile.
  bool fp16_tile = false;
  // Where each path requests its lines ahead of the reads (prefetch_levels()),
  // and how far ahead (prefetch_distance()).
  PrefetchLevels prefetch;
  PrefetchDistance prefetch_ahead;
  // Time the task's phases (time_kernel_phases in pagoda/cpu_phase_clock.h).
  bool time_phases = false;
  // [heads] each head's sink, base 2, or null: rows start from the state the
  // merge of the chunks starts from with sinks (m = sink, l = 1, acc = 0)
  // instead of an empty one. A sequence task's (pagoda/cpu_sequence_tasks.h),
  // which folds every chunk of its sequence itself.
  const float* sinks = nullptr;

  // Out, row (p, h) at index position[p].partial + h:
  float* m = nullptr;                 // running max, base 2 (-inf: no key)
  float* l = nullptr;                 // sum of 2^(s - m)
  float* acc = nullptr;               // [.., v_head_dim] sum of 2^(s - m) * v
  float* scratch = nullptr;           // [partial_scratch_floats(rows, head_dim)], 64-byte aligned
};

// Positions per sub-block of the two-pass softmax. Sub-blocks are counted from
// the chunk's start, and chunks start at multiples of the split length, so a
// position's lane in a sub-block depends on the position alone when the split
// length is a multiple of kSubBlockTokens or smaller (one sub-block per chunk).
// The default split's length, so that a deterministic chunk is one sub-block
// (fewer passes from K's runs to V's and back, each with its softmax, line
// requests and merge): against 256, two a chunk, 0.86-1.01x the time by
// median, most 0.93-0.97x, where a task computes more than it reads (AMD Zen 5,
// 5 paired runs each: fp16 GQA 4 with four query rows, GQA 8, head_dim 64 and
// AVX2, one thread with the K/V in L3 or 8 x 4096 tokens on 2 threads, both
// modes; bf16 and e4m3 on the dot products; latent attention on the FMAs
// 0.86x), level where memory bounds it
// (fp16 GQA 4 with one query row on 2 threads, 9 runs: 1.003x; e4m3 with one
// query row 1.005x, latent attention's dot products 1.008x). The scores'
// scratch doubles: 256 KiB a thread at 128 rows.
inline constexpr int64_t kSubBlockTokens = 512;
// Most rows one task holds: a whole group of up to 128 query heads (latent
// attention has 16 to 128 per KV head), so each row is read once for all of
// them; the launch splits larger groups.
inline constexpr int32_t kMaxTaskRows = 128;
// Rows the launch packs positions up to (positions x heads) when the group is
// smaller: more, smaller tasks keep the threads busy.
inline constexpr int32_t kTaskRowsTarget = 64;

// Floats of scratch one task of `rows` rows needs: scores and sub-block
// accumulators (rows rounded up to 16: whole tiles on the matrix path), a
// converted tile, q packed (quad scores' blocks of four rows, or the matrix
// path's bf16 q: rows rounded up to 16), and
// the matrix path's fp8 V rows as bf16, each region starting on a 64-byte
// line; head_dim bounds V's width.
inline int64_t partial_scratch_floats(int32_t rows, int32_t head_dim) {
  constexpr int64_t kTileTokens = 32;
  const int64_t rows_pad = (rows + 15) / 16 * 16;
  return rows_pad * kSubBlockTokens + rows_pad * static_cast<int64_t>(head_dim) + kTileTokens * head_dim +
         rows_pad * head_dim + 16 * static_cast<int64_t>(head_dim) + 256;
}

void compute_partial(const PartialTask& task);

// out[i] = 2^x[i] for x[i] <= 0 (or -inf), as the softmax weighs a score x
// below its row's max on the dispatched target: within 1.65 * 2^-24 of the
// exact value relative, exactly 2^x for integer x down to -126, and 0 below
// -126 (the accuracy test holds each target to this).
void softmax_exp2(const float* x, float* out, int64_t n);

}  // namespace pagoda::cpu
