// One task of the FMA path (partial_impl): its chunk's keys sub-block by
// sub-block, scores, softmax, P.V and merge, each row block reading in place or
// from a tile.
//
// Part of the CPU kernel's per-target code: decode_cpu.cc includes it after
// Highway's foreach_target, once per SIMD target (hence the toggled guard).

#include <algorithm>
#include <cstdint>
#include <type_traits>

#include <hwy/highway.h>

#include "cpu/decode_blocking_inl.h"
#include "cpu/decode_cpu.h"
#include "cpu/decode_quads_inl.h"
#include "cpu/decode_reads_inl.h"
#include "cpu/decode_scores_inl.h"
#include "cpu/decode_softmax_inl.h"
#include "cpu/decode_states_inl.h"
#include "cpu/decode_stretches_inl.h"
#include "cpu/decode_tiles.h"
#include "cpu/decode_values_inl.h"
#include "cpu/phase_clock.h"
#include "pagoda/softmax_state.h"

#if defined(PAGODA_CPU_DECODE_TASK_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef PAGODA_CPU_DECODE_TASK_INL_H_
#undef PAGODA_CPU_DECODE_TASK_INL_H_
#else
#define PAGODA_CPU_DECODE_TASK_INL_H_
#endif

HWY_BEFORE_NAMESPACE();
namespace pagoda::cpu::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// kD: K's row (and q's); kDv: V's, kD itself or, under latent attention
// (docs/design.md §16), the first kDv elements of the same K row: pass 2 then
// reads the rows pass 1 read, from cache, and no V pool exists.
template <typename T, int kD, int kDv>
void partial_impl(const PartialTask& t) {
  static_assert(kDv <= kD, "V is at most K's row");
  const CacheGeometry& g = *t.geometry;
  const int32_t rows = t.positions * t.heads;
  constexpr int64_t kTile = tile_tokens(kD);

  // Scratch: scores [rows4][kSubBlockTokens] (rows rounded up to 4: quad
  // scores write whole blocks) | sub-block acc [rows][kDv] | tile [kTile][kD]
  // | packed q [rows4][kD] (quad scores, or bf16 in the paired order).
  const int64_t rows4 = (rows + kQuadRows - 1) / kQuadRows * kQuadRows;
  PhaseTimer clock(t.time_phases);
  float* scores = t.scratch;
  float* sub_acc = scores + rows4 * kSubBlockTokens;
  float* tile = sub_acc + static_cast<int64_t>(rows) * kDv;
  [[maybe_unused]] float* q_packed = tile + kTile * kD;  // AVX-512's quads, bf16's paired order
  auto* half_tile = reinterpret_cast<hwy::float16_t*>(tile);  // kHalfTile: the tile's first half, as fp16
  const bool quads =
      kQuadScoresFor<T> && (g.group_size() >= kQuadMinGroup || (!t.batch_invariant && rows > kQuadFastRows));

  reset_states(t, kDv);
  const ReadPlan plan(t);
  if (plan.empty()) return;
  const PoolRows k_src(t.k_layer, t.blocks, g, t.kv_head, sizeof(T), t.nan_free);
  const PoolRows v_src(t.v_layer, t.blocks, g, t.kv_head, sizeof(T), t.nan_free);
  constexpr int64_t kLinesPerRow = std::max<int64_t>(1, kD * static_cast<int64_t>(sizeof(T)) / 64);
  const int64_t lines_per_row = kLinesPerRow;
  LinePrefetch prefetch(plan, k_src, v_src, t.prefetch_ahead.rows(rows) * lines_per_row, t.prefetch.fma(rows));
  // Up to kDirectRows<T> rows read the cache directly (InPlace<T>); more share
  // a tile, converted once (an fp8 tile through the byte tables where they serve).
  // Quad scores read a 16- or 32-bit cache in place whatever the rows on
  // AVX-512 (each key once for four row blocks), an fp8 cache from the tile,
  // and an fp16 one from the tile too where this CPU's family widens faster
  // once (fp16_shared_through_tile). AVX2's read fp32 in place and fp16 up to
  // direct_rows, as its row blocks do (decode_quads_inl.h).
  const bool fp16_tile = std::is_same_v<T, hwy::float16_t> && t.fp16_tile;
  // On AVX2, where this family widens beside the FMAs (!t.fp16_tile), up
  // to four row blocks read a 16-bit cache in place, K and V alike, whatever
  // the positions (AMD Zen 3, 8 x 4096 tokens, 2 threads, medians of 6 to 8
  // alternating runs against the tile: GQA 4 with two, three and four query
  // rows 0.93x, 0.91x and 0.94x the time, fast mode 0.95x; GQA 16 with one
  // 0.95x; head_dim 64 and 256 with four 0.96x and 0.91x; latent attention's
  // 16 heads 0.88x). bf16 does so in the paired order, one instruction a
  // vector (kPairedOrder; zero-extended and shifted, two, it had taken
  // 1.01-1.03x in place and kept the tile): against that tile, medians of 6
  // alternating runs, GQA 4 with three and four query rows 0.90x and 0.93x the
  // time, head_dim 256 with four 0.91x, 64 level. An fp8 cache's rows go
  // through its fp16 tile (kHalfTile) at every width there, each block
  // widening the fp16 where an fp32 tile was widened once (Zen 3, medians of
  // 5 or 6 alternating runs: e4m3 GQA 8 with one query row 0.76x the time,
  // e5m2 0.84x; 16 rows, e4m3 GQA 4 with four 0.89x, e5m2 0.87x, GQA 8 with
  // two and GQA 16 with one 0.84x; 32 rows 0.93x, 64 0.95x).
  const bool widen_shared_16bit = HWY_TARGET == HWY_AVX2 && !t.fp16_tile;
  const int direct_rows = !widen_shared_16bit ? kDirectRows<T>
                          : sizeof(T) == 2   ? kAvx2Direct16BitRows
                          : kHalfTile<T>     ? kMaxTaskRows
                                             : kDirectRows<T>;
  const bool direct_k = !quads ? rows <= direct_rows
                                : !kIsFp8<T> && !fp16_tile && (kWideTarget || sizeof(T) == 4 || rows <= direct_rows);
  // V of a 16- or 32-bit cache is read in place on AVX-512 whatever the rows:
  // each block widens the rows it reads, where a tile widened them once and
  // was stored and reloaded. By position (one thread, K/V in L3, four query
  // rows: fp16 GQA 4 0.96x the time, GQA 8 0.92-0.95x, bf16 on the FMAs
  // 0.96x); and past 16 heads, where the tile held P.V to a call per 16 or 32
  // tokens, each reloading and storing every row's sums, and a stretch's calls
  // keep them over 64 (AMD Zen 5, medians of 4 alternating runs: latent
  // attention's 32 bf16 heads on the FMAs, 8 x 4096 tokens on 2 threads, P.V
  // from 0.59-0.61 of the FMA peak to 0.85-0.87, 0.83x the time; GQA 32 on one
  // thread, K/V in L3, fp16 0.96x, bf16 0.95x). fp8, widened in several
  // instructions, keeps the tile (1.14x in place), and so does AVX2 past
  // direct_rows, whose calls go run by run (latent attention's 32 bf16 heads
  // 1.8-2.0x in place on Zen 5).
  const bool direct_v = (kRowPointers && sizeof(T) >= 2) || (t.heads <= kDirectRows<T> && t.positions == 1) ||
                        (direct_rows > kDirectRows<T> && rows <= direct_rows);
  const bool tables = kIsFp8<T> && kWideTarget && t.fp8_tables;
#if HWY_TARGET == HWY_AVX3 || HWY_TARGET == HWY_AVX3_DL || HWY_TARGET == HWY_AVX2
  if constexpr (kQuadScoresFor<T>) {
    if (quads) pack_q_quads<kD>(t, rows, q_packed);
  }
#endif
  // q of each row, in the order its keys are read (kPairedOrder: packed so,
  // where quad scores pack theirs).
  const auto q_of = [&](int32_t r) { return t.position[r / t.heads].q + r % t.heads * kD; };
  if constexpr (kPairedOrder<T>) {
    if (!quads) {
      for (int32_t r = 0; r < rows; ++r) to_paired_order<kD>(q_of(r), q_packed + static_cast<int64_t>(r) * kD);
    }
  }

  const float* q_rows[kRowBlock];
  float* outs[kRowBlock];
  const float* p_rows[kRowBlock];
  float* acc_rows[kRowBlock];
  SoftmaxStats<float> stats[kMaxTaskRows];
  // The stretch read in place: its first row, and (kRowPointers) every row.
  const void* first_row = nullptr;
  const void* row_ptr[kRowPointers ? kSubBlockTokens : 1];
  const auto in_place_rows = [&]() {
    if constexpr (kRowPointers) {
      return PointerRows<InPlace<T>>{row_ptr};
    } else {
      return RunRows<InPlace<T>>{static_cast<const InPlace<T>*>(first_row), kD};
    }
  };
  // K's and V's runs read in place as one stretch (kRunLists), for tasks
  // bound by their multiplies; K's rows through pointers.
  RunList<InPlace<T>> v_runs;
  RunList<InPlace<T>> k_runs;
  const void* k_row[kRunLists ? kPvChunkTokens : 1];
  const bool list_runs_here = kRunLists && rows > kFewPrefetchRows;
  // Where a stretch is read from: in place, the tile, or (kHalfTile) the
  // tile's fp16 half.
  enum class From { kInPlace, kTile, kHalfTile };
  // Loads the stretch of rows from `pos` (the first kWidth elements of each):
  // in place where `direct` allows and its run can be, else into a tile.
  // Returns its rows and where they are.
  const auto load_stretch = [&](const PoolRows& src, int64_t pos, int64_t end, bool direct, auto width,
                                From* from) {
    constexpr int kWidth = decltype(width)::value;
    if (direct && !kHalfTile<T>) {
      const int64_t n = in_place_stretch<T, kD>(src, pos, end, row_ptr, &first_row);
      *from = From::kInPlace;
      if (n > 0) return n;
    }
    const int64_t n = std::min(kTile, end - pos);
    if constexpr (kHalfTile<T>) {
      if (direct) {
        *from = From::kHalfTile;
        load_tile_half<T, kWidth, kD>(src, pos, n, half_tile);
        return n;
      }
    }
    *from = From::kTile;
    load_tile<T, kWidth, kD>(src, pos, n, tile, tables);
    return n;
  };
  // fn(rows) with the stretch's rows as `from` says.
  const auto with_rows = [&](From from, auto width, const auto& fn) {
    constexpr int kWidth = decltype(width)::value;
    if (from == From::kInPlace) return fn(in_place_rows());
    if constexpr (kHalfTile<T>) {
      if (from == From::kHalfTile) return fn(RunRows<hwy::float16_t>{half_tile, kWidth});
    }
    fn(RunRows<float>{tile, kWidth});
  };
  // with_rows, or (kRunLists) where `listed` the stretch's list of runs.
  const auto with_listed_rows = [&](bool listed, const auto& list, From from, auto width, const auto& fn) {
    if constexpr (kRunLists) {
      if (listed) return fn(list);
    }
    with_rows(from, width, fn);
  };

  for (int64_t sb = plan.first_sub_block(); sb < plan.end_sub_block(); ++sb) {
    const int64_t base = t.chunk_begin + sb * kSubBlockTokens;  // scores index = position - base
    const ReadPlan::Span span = plan.sub_block(sb);
    clock.mark(KernelPhase::kOther);

    // Pass 1: every row's scores over the sub-block's keys, a stretch at a
    // time: rows read in place (direct: one run, or with kRowPointers the runs
    // that follow it), or one tile (shared by several row blocks, or holding an
    // e4m3 NaN code; on AVX2 an fp8 cache's direct rows as fp16), one call per
    // row block.
    for (int64_t pos = span.begin; pos < span.end;) {
      From from;
      int64_t n = load_stretch(k_src, pos, span.end, direct_k, std::integral_constant<int, kD>(), &from);
      bool k_listed = false;
      if constexpr (kRunLists) {
        if (list_runs_here && from == From::kInPlace && n < kPvChunkTokens) {
          n = list_runs<T, kD>(k_src, pos, span.end, first_row, n, &k_runs);
          k_listed = k_runs.runs > 1;
          if (k_listed) k_runs.row_pointers(k_row);
        }
      }
      prefetch.consumed(n * lines_per_row);
#if HWY_TARGET == HWY_AVX3 || HWY_TARGET == HWY_AVX3_DL || HWY_TARGET == HWY_AVX2
      if constexpr (kQuadScoresFor<T>) {
        if (quads) {
          float* quad_outs[kMaxTaskRows];
          for (int64_t r = 0; r < rows4; ++r) quad_outs[r] = scores + r * kSubBlockTokens + (pos - base);
          const auto score = [&](auto keys) {
            using Element = typename decltype(keys)::Element;
            if constexpr (kIsFp8Bits<Element>) {
              HWY_ABORT("quad scores read fp8 keys from a tile only (direct_k)");
            } else {
              score_quads<Element, kD, kLinesPerRow>(q_packed, rows, keys, n, quad_outs, prefetch);
            }
          };
          with_listed_rows(k_listed, PointerRows<InPlace<T>>{k_row}, from, std::integral_constant<int, kD>(), score);
          prefetch.catch_up();
          pos += n;
          continue;
        }
      }
#endif
      // The first row block requests this stretch's worth of lines as it goes.
      bool first_block = true;
      for_row_blocks(rows, [&](auto block, int32_t r0) {
        constexpr int kRows = decltype(block)::value;
        for (int j = 0; j < kRows; ++j) {
          const int32_t r = r0 + j;
          q_rows[j] = kPairedOrder<T> ? q_packed + static_cast<int64_t>(r) * kD : q_of(r);
          outs[j] = scores + static_cast<int64_t>(r) * kSubBlockTokens + (pos - base);
        }
        const auto score = [&](auto keys) {
          using Element = typename decltype(keys)::Element;
          if (from == From::kInPlace || first_block) {
            score_rows<Element, kD, kRows, kLinesPerRow>(q_rows, keys, n, outs, prefetch);
          } else {
            score_rows<Element, kD, kRows, 0>(q_rows, keys, n, outs, prefetch);
          }
        };
        with_listed_rows(k_listed, PointerRows<InPlace<T>>{k_row}, from, std::integral_constant<int, kD>(), score);
        first_block = false;
      });
      prefetch.catch_up();
      pos += n;
    }
    clock.mark(KernelPhase::kScores);
    softmax_sub_block(t, plan, sb, scores, stats);
    clock.mark(KernelPhase::kSoftmax);
    // Pass 2: P.V, each position over its own keys, in the same stretches.
    // A position's first stretch with keys writes its rows' sums from zero
    // (no fill of the sub-block's accumulators beforehand).
    bool started[kMaxTaskRows] = {};
    for (int64_t pos = span.begin; pos < span.end;) {
      // V's rows hold head_dim elements, of which the first kDv are read.
      From from;
      int64_t n = load_stretch(v_src, pos, span.end, direct_v, std::integral_constant<int, kDv>(), &from);
      const bool v_listed = list_runs_here && from == From::kInPlace;
      if constexpr (kRunLists) {
        if (v_listed) n = list_runs<T, kD>(v_src, pos, span.end, first_row, n, &v_runs);
      }
      prefetch.consumed(n * lines_per_row);
      int64_t step_lines = lines_per_row;  // per token, in the first P.V call of the stretch
      for (int32_t p = 0; p < t.positions; ++p) {
        const ReadPlan::Span keys = plan.keys_of(p, sb);
        const int64_t a = std::max(keys.begin, pos) - pos;
        const int64_t b = std::min(keys.end, pos + n) - pos;
        if (a >= b) continue;
        for_row_blocks(t.heads, [&](auto block, int32_t h0) {
          constexpr int kRows = decltype(block)::value;
          for (int j = 0; j < kRows; ++j) {
            const int32_t r = p * t.heads + h0 + j;
            p_rows[j] = scores + static_cast<int64_t>(r) * kSubBlockTokens + (pos - base);
            acc_rows[j] = sub_acc + static_cast<int64_t>(r) * kDv;
          }
          const auto accumulate = [&](auto values) {
            using Element = typename decltype(values)::Element;
            accumulate_rows<Element, kDv, kRows>(p_rows, values, a, b, acc_rows, prefetch, step_lines, !started[p]);
          };
          with_listed_rows(v_listed, v_runs, from, std::integral_constant<int, kDv>(), accumulate);
          step_lines = 0;
        });
        started[p] = true;
      }
      prefetch.catch_up();
      pos += n;
    }
    clock.mark(KernelPhase::kValues);
    if constexpr (kPairedOrder<T>) from_paired_order(sub_acc, rows, kDv);
    merge_sub_block(t, stats, sub_acc, kDv);
    clock.mark(KernelPhase::kMerge);
  }
}

}  // namespace pagoda::cpu::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#endif  // PAGODA_CPU_DECODE_TASK_INL_H_
