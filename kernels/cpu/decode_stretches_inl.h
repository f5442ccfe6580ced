// Where a task's row blocks read their rows: tiles widened once for several
// blocks (fp32, or on AVX2 fp8's fp16 tile), stretches read in place, lists of
// runs, and the blocks of rows themselves.
//
// Part of the CPU kernel's per-target code: decode_cpu.cc includes it after
// Highway's foreach_target, once per SIMD target (hence the toggled guard).

#include <algorithm>
#include <cstdint>
#include <type_traits>

#include <hwy/highway.h>

#include "cpu/decode_blocking_inl.h"
#include "cpu/decode_cpu.h"
#include "cpu/decode_reads_inl.h"
#include "cpu/decode_tiles.h"
#include "cpu/fp8_tables.h"
#include "pagoda/vocabulary.h"

#if defined(PAGODA_CPU_DECODE_STRETCHES_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef PAGODA_CPU_DECODE_STRETCHES_INL_H_
#undef PAGODA_CPU_DECODE_STRETCHES_INL_H_
#else
#define PAGODA_CPU_DECODE_STRETCHES_INL_H_
#endif

HWY_BEFORE_NAMESPACE();
namespace pagoda::cpu::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

template <typename T>
constexpr DType kFp8Format = std::is_same_v<T, Fp8E4M3Bits> ? DType::kFloat8E4M3 : DType::kFloat8E5M2;

// The first kD elements of rows [pos, pos + n) (kStride elements apart in the
// pool: kD, or head_dim for V as K's prefix) into `tile` ([n][kD] fp32; bf16
// in the paired order, as the loops read it in place), run by
// run: the rows of one block are contiguous, so each run converts (or, for an
// fp32 cache, copies) as one stream. Used when several row blocks share the
// rows, and for runs an e4m3 read cannot take in place; fp8 runs widen through
// the byte tables with `tables`.
template <typename T, int kD, int kStride = kD>
HWY_NOINLINE void load_tile(const PoolRows& src, int64_t pos, int64_t n, float* HWY_RESTRICT tile,
                            bool tables = false) {
  const DF df;
  constexpr int64_t kLanes = static_cast<int64_t>(hn::MaxLanes(df));
  const int64_t end = pos + n;
  while (pos < end) {
    int64_t rows = 0;
    const T* HWY_RESTRICT in = reinterpret_cast<const T*>(src.run(pos, end, &rows));
    if constexpr (kIsFp8<T>) {
      if (tables) {
        fp8tab::rows_to_f32(kFp8Format<T>, reinterpret_cast<const uint8_t*>(in), kStride, rows, kD, tile);
        tile += rows * kD;
        pos += rows;
        continue;
      }
    }
    for (int64_t r = 0; r < rows; ++r, in += kStride, tile += kD) {
      if constexpr (kPairedOrder<T>) {
        for (int64_t i = 0; i < kD; i += 2 * kLanes) {
          VF a, b;
          load_f32_pair(in + i, a, b);
          hn::Store(a, df, tile + i);
          hn::Store(b, df, tile + i + kLanes);
        }
      } else {
        for (int64_t i = 0; i < kD; i += kLanes) hn::Store(load_f32(in + i), df, tile + i);
      }
    }
    pos += rows;
  }
}

// AVX2 reads an fp8 cache that it would read in place (few rows) through a
// tile of fp16 values instead: each code's fp16 bits (load_f32's) are made once,
// 16 to a vector, and the compute loops then read them as an fp16 cache, one
// conversion a vector, where in place each vector of 8 took 3 (e5m2) or 4
// (e4m3) instructions. The same values, so the same bits. AMD Zen 5, GQA 4, one
// query row: e4m3 0.85-0.88x the time at 8 x 4096 tokens on 2 threads (head_dim
// 64 0.89-0.91x) and 0.81x on one thread with the K/V in L3; e5m2 0.91x on one
// thread, 0.98-1.0x on two. On AMD Zen 3 the codes read in place took 1.30x
// the time for e4m3 and 1.20x for e5m2 (the same shape, one pinned thread, K/V
// in L2, 8 alternating runs), and stretches of 64 rows through the fp16 tile
// (it holds twice the fp32 tile's rows) in place of 32 measured level (e4m3,
// one and four query rows, 12 runs). Where the CPU widens fp16 beside its FMAs
// it serves every width of task, each row block widening the fp16 (partial_impl).
template <typename T>
constexpr bool kHalfTile = !kWideTarget && kIsFp8<T> && HWY_TARGET != HWY_SCALAR;

// As load_tile, into an fp16 tile ([n][kD]); a run with no e4m3 NaN code
// skips the NaN step.
template <typename T, int kD, int kStride = kD>
HWY_NOINLINE void load_tile_half(const PoolRows& src, int64_t pos, int64_t n, hwy::float16_t* HWY_RESTRICT tile) {
  const hn::ScalableTag<int16_t> d16;
  constexpr int64_t kLanes = static_cast<int64_t>(hn::MaxLanes(d16));
  static_assert(kD % kLanes == 0, "a row is whole vectors of codes");
  auto* HWY_RESTRICT out = reinterpret_cast<int16_t*>(tile);
  const int64_t end = pos + n;
  while (pos < end) {
    int64_t rows = 0;
    const T* HWY_RESTRICT in = reinterpret_cast<const T*>(src.run(pos, end, &rows));
    const auto convert = [&](auto codes) {
      using Codes = decltype(codes);
      const Codes* HWY_RESTRICT row = reinterpret_cast<const Codes*>(in);
      for (int64_t r = 0; r < rows; ++r, row += kStride, out += kD) {
        for (int64_t i = 0; i < kD; i += kLanes) hn::StoreU(fp16_bits(d16, row + i), d16, out + i);
      }
    };
    if (readable_in_place<T, kStride>(src, pos, in, rows)) {
      convert(InPlace<T>{});
    } else {
      convert(T{});
    }
    pos += rows;
  }
}

// The stretch of rows read in place from `pos` on, up to `end`: its first run
// (*first: its first row), and with kRowPointers the runs after it too, as
// pointers into rows[]. It stops before a run that cannot be read in place (an
// e4m3 run holding a NaN code); returns its rows, 0 when the first run cannot.
// An e4m3 stretch stops after kScanRows: the scan touches the rows first, and
// a longer one waits on memory there, not on compute.
template <typename T>
constexpr int64_t kScanRows = std::is_same_v<T, Fp8E4M3Bits> ? 16 : kSubBlockTokens;
template <typename T, int kD>
HWY_INLINE int64_t in_place_stretch(const PoolRows& src, int64_t pos, int64_t end, const void** HWY_RESTRICT rows,
                                    const void** first) {
  int64_t count = 0;
  if constexpr (kRowPointers) end = std::min(end, pos + kScanRows<T>);
  while (pos < end) {
    int64_t n = 0;
    const std::byte* run = src.run(pos, end, &n);
    if (!readable_in_place<T, kD>(src, pos, run, n)) break;
    if (count == 0) *first = run;
    if constexpr (!kRowPointers) return n;
    for (int64_t i = 0; i < n; ++i) rows[count + i] = run + i * src.row_bytes;
    count += n;
    pos += n;
  }
  return count;
}

// The in-place run of n rows at `first` (from `pos`) and the runs after it up
// to `end`, into `list`: up to RunList's kMaxRuns runs, and past the first
// while the list stays within kPvChunkTokens rows and half of L1
// (kRunListBytes): each step of P.V reads the list's rows again, from L1.
// Returns the list's rows.
constexpr int64_t kRunListBytes = 16 * 1024;
template <typename T, int kD>
HWY_INLINE int64_t list_runs(const PoolRows& src, int64_t pos, int64_t end, const void* first, int64_t n,
                             RunList<InPlace<T>>* list) {
  using Row = InPlace<T>;
  list->stride = src.row_bytes / static_cast<int64_t>(sizeof(Row));
  list->first[0] = static_cast<const Row*>(first);
  list->begin[0] = 0;
  list->begin[1] = n;
  list->runs = 1;
  const int64_t most = std::min(kPvChunkTokens, kRunListBytes / src.row_bytes);
  while (list->runs < RunList<Row>::kMaxRuns && n < most && pos + n < end) {
    int64_t rows = 0;
    const std::byte* run = src.run(pos + n, end, &rows);
    if (n + rows > most || !readable_in_place<T, kD>(src, pos + n, run, rows)) break;
    list->first[list->runs] = reinterpret_cast<const Row*>(run);
    n += rows;
    list->begin[++list->runs] = n;
  }
  return n;
}

// Calls fn(std::integral_constant<int, kRows>, first) for blocks of up to
// kRowBlock rows covering [0, count): blocks of 4, then a 2 and a 1 as needed.
template <typename Fn>
HWY_INLINE void for_row_blocks(int32_t count, const Fn& fn) {
  static_assert(kRowBlock == 4, "blocks of 4 rows, then 2 and 1");
  int32_t r = 0;
  for (; r + 4 <= count; r += 4) fn(std::integral_constant<int, 4>(), r);
  if (r + 2 <= count) {
    fn(std::integral_constant<int, 2>(), r);
    r += 2;
  }
  if (r < count) fn(std::integral_constant<int, 1>(), r);
}

}  // namespace pagoda::cpu::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#endif  // PAGODA_CPU_DECODE_STRETCHES_INL_H_
