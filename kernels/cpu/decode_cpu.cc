// Highway's foreach_target compiles this file once per SIMD target (the
// targets: kernels/cpu/CMakeLists.txt); the dispatcher picks the best one the
// CPU supports at run time.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "cpu/decode_cpu.cc"
#include <hwy/foreach_target.h>  // IWYU pragma: keep

#include <algorithm>
#include <chrono>
#include <cstring>
#include <limits>
#include <type_traits>

#include <hwy/cache_control.h>
#include <hwy/contrib/math/math-inl.h>
#include <hwy/highway.h>

#include "cpu/amx_tiles.h"
#include "cpu/bf16_dot.h"
#include "cpu/decode_cpu.h"
#include "cpu/decode_tiles.h"
#include "cpu/fp8_tables.h"
#include "cpu/phase_clock.h"
#include "cpu/state_merge.h"
#include "pagoda/softmax_state.h"
#include "pagoda/vocabulary.h"

HWY_BEFORE_NAMESPACE();
namespace pagoda::cpu::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

using DF = hn::ScalableTag<float>;
using VF = hn::Vec<DF>;

// Register blocking: kAccumulators accumulators, as many as the target's
// registers hold beside the operands (16 AVX2 registers, 32 AVX-512 ones).
// Scores: a block of rows x (kAccumulators / rows) tokens; P.V: rows x
// (kAccumulators / rows) vectors. Blocks have up to kRowBlock rows on every
// target: on AVX-512, 4 rows x 4 tokens of scores amortise each q vector over
// four tokens where 8 x 2 do over two, and measured 1.2-1.7x faster wherever a
// task has more than 4 rows (AMD Zen 5, 8 x 4096 tokens, 2 threads: fp16 GQA 4
// with four query rows 8.8 ms against 14.7, head_dim 64 4.8 against 7.4).
// Block sizes change no bits: each score and each output element is one
// chain of its own, whatever the block.
constexpr bool kWideTarget = HWY_TARGET == HWY_AVX3 || HWY_TARGET == HWY_AVX3_DL;
constexpr int kAccumulators = kWideTarget ? 16 : 8;
constexpr int kRowBlock = 4;
// Rows up to which the cache is read in place, each block widening what it
// reads (more share a tile, widened once): one block's, or of a 16-bit cache
// four on AVX-512 and two on AVX2, whose one-instruction widening costs about
// what a tile's store and reloads do (GQA 8 with one query row, fp16 and
// bf16: 5-6% faster in place on AVX-512, 0.97-0.98x the time on AVX2; 16
// rows, GQA 4 with four query rows: 0.95x for fp16, 0.97x for bf16, and V at
// GQA 16 with one: 0.97x; fp8, widened in several instructions, 10% faster
// from a tile). On AVX2 an fp8 cache's "in place" is a tile of its fp16
// values (kHalfTile).
template <typename T>
constexpr int kDirectRows = sizeof(T) == 2 ? (kWideTarget ? 4 : 2) * kRowBlock : kRowBlock;
// AVX2's rows for a 16-bit cache where the CPU widens beside its FMAs
// (fp16_shared_through_tile false): four blocks, as on AVX-512 (partial_impl).
constexpr int kAvx2Direct16BitRows = 4 * kRowBlock;
// AVX2 scores 4 rows x 3 tokens: 12 accumulators (many FMAs take q straight
// from memory), where 4 x 2 kept only the 8 chains that two FMA ports of
// latency 4 need, with no slack (AMD Zen 5, 2 threads, fp16 GQA 4, 8 x 4096
// tokens: 0.86-0.89x the time with one query row, 0.81x with four; head_dim
// 256 0.94x, bf16 and e4m3 level). A run's tail after its steps of 3 goes as
// one step of 2 or of 1 (score_rows), so no step scores dropped copies: steps
// of 3 with a wasteful tail were 1.04x the time of steps of 2 alone at head_dim
// 64, and 3+3+3+3+2+2 per 16-token block 1.05x the time of 3+3+3+3+3+1.
constexpr int score_tokens(int rows) {
  if (!kWideTarget && rows == 4) return 3;
  return kAccumulators / rows < 4 ? kAccumulators / rows : 4;
}
// AVX2's P.V likewise holds 4 rows x 3 vectors, the last step of a row 1 or 2
// (head_dim 64: 3 + 3 + 2): 12 chains where 8 left no slack (AMD Zen 5, fp16
// GQA 4, one query row, 8 x 4096 tokens on 2 threads: head_dim 64 0.92x the
// time, 128 0.98x, GQA 8 0.95x; one thread on a quiet core, K/V in L3:
// head_dim 64 0.97x, 256 0.96x, latent attention 0.95x; four query rows and
// e4m3 level). Splitting a step of one vector into two of two measured level
// (and on Zen 3, fp16 GQA 4 at head_dim 128, 0.93-1.09x by median of 6 runs,
// 0.98-1.00x by minimum).
constexpr int pv_vectors(int rows) { return !kWideTarget && rows == 4 ? 3 : kAccumulators / rows; }

// The fp8 codes' types: a format, or e4m3 rows known to hold no NaN code.
template <typename T>
constexpr bool kIsFp8Bits = std::is_same_v<T, Fp8E5M2Bits> || std::is_same_v<T, Fp8E4M3Bits> ||
                            std::is_same_v<T, Fp8E4M3FiniteBits>;

// Lanes(d16) fp8 codes at p as fp16 bit patterns, made with integer steps on
// 16-bit lanes: e5m2 is the top byte of an fp16. e4m3's byte, sign-extended to
// 16 bits and shifted left by 7, has its exponent and mantissa in an fp16's low
// exponent bits and its sign in bits 15 and 14; clearing bit 14 leaves an fp16
// reading 2^-8 of the value, exactly, subnormals included (fp8_read_factor
// folds the 2^8 back in). The NaN code S.1111.111 then reads 1.875, which no
// finite code does: it gets the fp16 exponent all ones.
template <typename T, class D16>
HWY_INLINE hn::Vec<D16> fp16_bits(D16 d16, const T* HWY_RESTRICT p) {
  static_assert(kIsFp8Bits<T>, "fp8 codes");
  if constexpr (std::is_same_v<T, Fp8E5M2Bits>) {
    const hn::Rebind<uint8_t, D16> d8;
    return hn::ShiftLeft<8>(hn::PromoteTo(d16, hn::LoadU(d8, reinterpret_cast<const uint8_t*>(p))));
  } else {
    const hn::Rebind<int8_t, D16> d8;
    const auto wide = hn::ShiftLeft<7>(hn::PromoteTo(d16, hn::LoadU(d8, reinterpret_cast<const int8_t*>(p))));
    auto h = hn::And(wide, hn::Set(d16, static_cast<int16_t>(0xBFFF)));
    if constexpr (std::is_same_v<T, Fp8E4M3Bits>) {
      const auto nan = hn::Eq(hn::And(h, hn::Set(d16, 0x7FFF)), hn::Set(d16, 0x3F80));
      h = hn::Or(h, hn::IfThenElseZero(nan, hn::Set(d16, 0x7C00)));
    }
    return h;
  }
}

// One vector of a row, as fp32: converted in registers for a 16- or 8-bit
// cache, fp8 through its fp16 bit patterns (F16C's conversion on x86).
template <typename T>
HWY_INLINE VF load_f32(const T* HWY_RESTRICT p) {
  const DF df;
  if constexpr (std::is_same_v<T, float>) {
    return hn::Load(df, p);
  } else if constexpr (kIsFp8Bits<T>) {
    const hn::Rebind<int16_t, DF> d16;
    const hn::Rebind<hwy::float16_t, DF> dh;
    return hn::PromoteTo(df, hn::BitCast(dh, fp16_bits(d16, p)));
  } else {
    const hn::Rebind<T, DF> dt;
    return hn::PromoteTo(df, hn::LoadU(dt, p));
  }
}

// bf16 on AVX-512 widens two vectors at once: one 64-byte load of 32 elements
// (16 on AVX2), then the even ones shifted into the top halves of their 32-bit
// lanes and the odd ones masked there, one instruction a vector where a
// vector's zero-extension and shift took two, both on the ports that issue
// 512-bit FMAs on Intel's cores. Lane j of pair u's vectors holds elements
// 2Lu + 2j and 2Lu + 2j + 1, L lanes (the paired order): q, the fp32 tiles and
// P.V's sums take the same order, and the sums go back to element order before
// each merge, so every score is still one chain per lane and every output
// element one chain over the keys, whatever the rows, the tile or the stretch.
// Intel Xeon (Ice Lake, AVX-512 without AVX512-BF16), bf16 GQA 4 on the FMAs,
// one thread, K/V in L2: 0.87x the time with one query row, 0.86x with four;
// 8 x 4096 tokens on 2 threads: four rows 0.92x, GQA 8 0.94-0.96x, one row at
// GQA 4 0.98x (bound by memory there), latent attention level (its V, read by
// 32 rows, goes through a tile widened once). AVX2 takes the same order, a
// vector at a time where a step holds an odd number (load_vector): one 32-byte
// load and a shift or a mask against a zero-extending load and a shift
// (AMD Zen 3, 8 x 4096 tokens on 2 threads, medians of 6 alternating runs:
// GQA 1 with four query rows 0.89x the time, GQA 4 with two 0.91x, GQA 8 with
// one 0.99x; one query row at GQA 1 and 4, bound by memory, level, and so are
// the 32-row tiles of GQA 8 with four and latent attention, widened once).
template <typename T>
constexpr bool kPairedOrder = (kWideTarget || HWY_TARGET == HWY_AVX2) && std::is_same_v<T, hwy::bfloat16_t>;

// One half of a pair of bf16 vectors loaded as 32-bit lanes w, as fp32: the
// even elements shifted into the top halves of their lanes, or the odd ones
// masked there.
HWY_INLINE VF paired_half(hn::Vec<hn::RebindToUnsigned<DF>> w, bool odd) {
  const DF df;
  const hn::RebindToUnsigned<DF> du;
  return hn::BitCast(df, odd ? hn::And(w, hn::Set(du, 0xFFFF0000u)) : hn::ShiftLeft<16>(w));
}

// Two vectors of a row from p: elements [0, 2 * lanes) in the paired order
// for bf16 (kPairedOrder), else the two vectors as they lie.
template <typename T>
HWY_INLINE void load_f32_pair(const T* HWY_RESTRICT p, VF& a, VF& b) {
  if constexpr (kPairedOrder<T>) {
    const hn::RebindToUnsigned<DF> du;
    const auto w = hn::LoadU(du, reinterpret_cast<const uint32_t*>(p));
    a = paired_half(w, false);
    b = paired_half(w, true);
  } else {
    const DF df;
    a = load_f32(p);
    b = load_f32(p + hn::MaxLanes(df));
  }
}

// Vector c of a row at p: in the paired order (kPairedOrder) the even or the
// odd elements of pair c / 2, one instruction after the load. AVX2's score
// loop then goes vector by vector, the half chosen by a branch and the odd
// half's mask read from the stack; unrolled with the half a constant, the
// mask held a register, one of the 12 sums went through the stack, and a
// task of 16 rows took 1.16-1.31x the time (one pinned thread, K/V in L2);
// with the odd half shifted down and up instead of masked, 1.11x.
template <typename T>
HWY_INLINE VF load_vector(const T* HWY_RESTRICT p, int64_t c) {
  const DF df;
  if constexpr (kPairedOrder<T>) {
    const hn::RebindToUnsigned<DF> du;
    return paired_half(hn::LoadU(du, reinterpret_cast<const uint32_t*>(p + c / 2 * 2 * hn::MaxLanes(df))), c % 2 != 0);
  } else {
    return load_f32(p + c * hn::MaxLanes(df));
  }
}

// n fp32 rows of kD elements (kD a multiple of two vectors) from element order
// into the paired order (q of a bf16 task, kPairedOrder).
template <int kD>
HWY_INLINE void to_paired_order(const float* HWY_RESTRICT in, float* HWY_RESTRICT out) {
#if HWY_TARGET == HWY_AVX3 || HWY_TARGET == HWY_AVX3_DL || HWY_TARGET == HWY_AVX2
  const DF df;
  constexpr int64_t kLanes = static_cast<int64_t>(hn::MaxLanes(df));
  static_assert(kD % (2 * kLanes) == 0, "whole pairs of vectors");
  for (int64_t i = 0; i < kD; i += 2 * kLanes) {
    const VF lo = hn::LoadU(df, in + i);
    const VF hi = hn::LoadU(df, in + i + kLanes);
    hn::StoreU(hn::ConcatEven(df, hi, lo), df, out + i);
    hn::StoreU(hn::ConcatOdd(df, hi, lo), df, out + i + kLanes);
  }
#else
  (void)in, (void)out;
#endif
}

// e4m3 rows known to hold no NaN code read without the NaN step: 3 of its 8
// instructions a vector. Each run read in place is scanned first, unless the
// backend knows its slots hold none (readable_in_place); a run with a NaN
// code goes through a tile instead.
template <typename T>
using InPlace = std::conditional_t<std::is_same_v<T, Fp8E4M3Bits>, Fp8E4M3FiniteBits, T>;

// Whether any of the n codes at p (n a multiple of 64) is e4m3's NaN, S.1111.111:
// with the sign bit set, the only code reading 0xFF. Two instructions a vector.
HWY_INLINE bool any_e4m3_nan(const uint8_t* HWY_RESTRICT p, int64_t n) {
  const hn::ScalableTag<uint8_t> d8;
  constexpr int64_t kLanes = static_cast<int64_t>(hn::MaxLanes(d8));
  static_assert(64 % kLanes == 0, "a head's row is whole vectors of codes");
  const auto sign = hn::Set(d8, 0x80);
  auto top = hn::Zero(d8);
  for (int64_t i = 0; i < n; i += kLanes) top = hn::Max(top, hn::Or(hn::LoadU(d8, p + i), sign));
  return !hn::AllFalse(d8, hn::Eq(top, hn::Set(d8, 0xFF)));
}

// Whether the run of n rows of kD elements at `rows` (from position `pos` of
// src) may be read in place as InPlace<T>: always, but for e4m3 rows only
// without a NaN code: known so from the backend's marks (the service's own
// cache: appends refuse non-finite values), else scanned. Skipping the scan
// took e4m3 GQA 4 with one query row to 0.89-0.93x the time at 8 x 4096
// tokens on 2 threads and 0.93-0.95x on one thread with the K/V in L2, four
// query rows 0.96x in L2 and level within the noise on 2 threads (AMD Zen 3,
// AVX2, medians and minimums of 6 to 10 alternating runs).
template <typename T, int kD>
HWY_INLINE bool readable_in_place(const PoolRows& src, int64_t pos, const void* rows, int64_t n) {
  if constexpr (std::is_same_v<T, Fp8E4M3Bits>) {
    return src.known_nan_free(pos, n) || !any_e4m3_nan(static_cast<const uint8_t*>(rows), n * kD);
  } else {
    (void)src, (void)pos, (void)rows, (void)n;
    return true;
  }
}

// ---- where a call's rows lie ---------------------------------------------------

// Rows[t] is row t of a call's keys or values. RunRows: one contiguous run (of
// the cache, `stride` elements apart, or a converted tile). PointerRows: a
// stretch of runs gathered across the cache's blocks, read in place in one
// call per row block, on AVX-512 (with 16-token blocks, a call per block cost
// 10-16% of the compute cache-resident, 5-16% at head_dim 64 from memory). AVX2
// keeps one call per run: with 16 registers, none left for the pointers, it
// measured 7-9% slower gathered on Zen 5, and on Zen 3 (fp16 GQA 4, 8 x 4096
// tokens on 2 threads, K and V read in place) 1.21x the time with one query
// row and 1.17x with four.
template <typename T>
struct RunRows {
  using Element = T;
  static constexpr bool kStretch = false;
  const T* HWY_RESTRICT first;
  int64_t stride;
  HWY_INLINE const T* operator[](int64_t t) const { return first + t * stride; }
};
template <typename T>
struct PointerRows {
  using Element = T;
  static constexpr bool kStretch = true;
  const void* const* HWY_RESTRICT rows;
  HWY_INLINE const T* operator[](int64_t t) const { return static_cast<const T*>(rows[t]); }
};
constexpr bool kRowPointers = kWideTarget;
// RunList: up to kMaxRuns runs of the cache, each contiguous, read in place as
// one stretch by AVX2 tasks of more than kFewPrefetchRows rows, the ones bound
// by their multiplies. P.V loops over the list's runs with its sums kept in
// registers from one run to the next (no pointer per row), where a call per
// run stored and reloaded them at every block's end; the scores walk the
// list's rows through pointers (PointerRows), so a run's last token no longer
// ends in a step of one. AMD Zen 3, fp16, 8 x 4096 tokens on 2 threads,
// medians of 8 alternating runs: GQA 4 with four query rows 0.93-0.94x the
// time, head_dim 64 0.87-0.99x (0.91-0.93x by minimum), GQA 16 with one level;
// one pinned thread: head_dim 128 0.95-0.96x with V listed, K's list adding
// nothing there, head_dim 64 0.91-0.94x with both where V's alone was level.
// Tasks of 4 and 8 rows, whose reads are the limit, took 1.05-1.09x and
// 1.07-1.08x the time listed, and keep a call per run.
constexpr bool kRunLists = HWY_TARGET == HWY_AVX2;
template <typename T>
struct RunList {
  using Element = T;
  static constexpr bool kStretch = false;  // each step over all of its rows
  static constexpr int kMaxRuns = 4;
  const T* HWY_RESTRICT first[kMaxRuns];  // run i's first row
  int64_t begin[kMaxRuns + 1];            // run i holds the list's rows [begin[i], begin[i + 1])
  int32_t runs = 0;
  int64_t stride;

  // Each of the list's rows, by its first element: the scores' PointerRows.
  void row_pointers(const void** out) const {
    for (int32_t i = 0; i < runs; ++i)
      for (int64_t j = begin[i]; j < begin[i + 1]; ++j) out[j] = first[i] + (j - begin[i]) * stride;
  }
};

// ---- scores ------------------------------------------------------------------

// The lane sums of a0..a3 in lanes 0..3 of one 128-bit vector. Pairs of lanes
// are added inside each 128-bit block first (two interleaves), then the blocks:
// every input's lanes go through the same tree whatever the other inputs are,
// so a score has the same bits wherever it sits in a block.
#if HWY_TARGET != HWY_SCALAR
template <class D = DF, class V = hn::Vec<D>>
HWY_INLINE hn::Vec<hn::Full128<float>> lane_sums4(V a0, V a1, V a2, V a3) {
  const D df;
  const hn::Repartition<uint64_t, D> du;
  const V s01 = hn::Add(hn::InterleaveLower(df, a0, a1), hn::InterleaveUpper(df, a0, a1));
  const V s23 = hn::Add(hn::InterleaveLower(df, a2, a3), hn::InterleaveUpper(df, a2, a3));
  const V u = hn::Add(hn::BitCast(df, hn::InterleaveLower(du, hn::BitCast(du, s01), hn::BitCast(du, s23))),
                      hn::BitCast(df, hn::InterleaveUpper(du, hn::BitCast(du, s01), hn::BitCast(du, s23))));
  const hn::Full128<float> d4;
  if constexpr (hn::MaxLanes(D()) == 4) {
    return u;
  } else if constexpr (hn::MaxLanes(D()) == 8) {
    return hn::Add(hn::LowerHalf(d4, u), hn::UpperHalf(d4, u));
  } else {
    const hn::Half<D> d8;
    const auto h = hn::Add(hn::LowerHalf(d8, u), hn::UpperHalf(d8, u));
    return hn::Add(hn::LowerHalf(d4, h), hn::UpperHalf(d4, h));
  }
}
#endif

// Stores the lane sums of acc (kRows x kTokens accumulators) to out[r][t ..
// t + n). With `room`, out[r][t + n] may be written too: a later step of the
// same rows writes it.
template <int kRows, int kTokens>
HWY_INLINE void store_scores(VF (&acc)[kRows][kTokens], float* const* HWY_RESTRICT out, int64_t t, int64_t n,
                             [[maybe_unused]] bool room) {
#if HWY_TARGET == HWY_SCALAR
  for (int r = 0; r < kRows; ++r)
    for (int64_t j = 0; j < n; ++j) out[r][t + j] = hn::GetLane(acc[r][j]);
#else
  const hn::Full128<float> d4;
  HWY_ALIGN float tail[4];
  if constexpr (kRows == 4 && kTokens == 3) {
    // AVX2's 4 x 3 step: the 12 sums in three trees of four, not four trees
    // of three and a copy. Every input goes through the same tree wherever it
    // sits, so a score has the bits it had. A row's three scores go out as one
    // 4-float store where the fourth lane's slot is written later anyway (AMD
    // Zen 5, fp16 GQA 4, one thread, 2048 tokens: head_dim 64 0.94-0.97x the
    // time, 128 0.97x).
    const hn::Half<decltype(d4)> d2;
    const auto s0 = lane_sums4(acc[0][0], acc[0][1], acc[0][2], acc[1][0]);
    const auto s1 = lane_sums4(acc[1][1], acc[1][2], acc[2][0], acc[2][1]);
    const auto s2 = lane_sums4(acc[3][0], acc[3][1], acc[3][2], acc[2][2]);
    if (HWY_LIKELY(n == 3)) {
      if (HWY_LIKELY(room)) {
        hn::StoreU(s0, d4, out[0] + t);
        hn::StoreU(s2, d4, out[3] + t);
      } else {
        hn::StoreU(hn::LowerHalf(d2, s0), d2, out[0] + t);
        out[0][t + 2] = hn::ExtractLane(s0, 2);
        hn::StoreU(hn::LowerHalf(d2, s2), d2, out[3] + t);
        out[3][t + 2] = hn::ExtractLane(s2, 2);
      }
      out[1][t] = hn::ExtractLane(s0, 3);
      hn::StoreU(hn::LowerHalf(d2, s1), d2, out[1] + t + 1);
      hn::StoreU(hn::UpperHalf(d2, s1), d2, out[2] + t);
      out[2][t + 2] = hn::ExtractLane(s2, 3);
    } else {
      HWY_ALIGN float sums[12];
      hn::Store(s0, d4, sums);
      hn::Store(s1, d4, sums + 4);
      hn::Store(s2, d4, sums + 8);
      constexpr int kAt[4][3] = {{0, 1, 2}, {3, 4, 5}, {6, 7, 11}, {8, 9, 10}};
      for (int r = 0; r < 4; ++r)
        for (int64_t j = 0; j < n; ++j) out[r][t + j] = sums[kAt[r][j]];
    }
  } else if constexpr (kTokens == 4) {
    for (int r = 0; r < kRows; ++r) {
      const auto s = lane_sums4(acc[r][0], acc[r][1], acc[r][2], acc[r][3]);
      if (HWY_LIKELY(n == 4)) {
        hn::StoreU(s, d4, out[r] + t);
      } else {  // a tail step, its last token repeated
        hn::Store(s, d4, tail);
        std::memcpy(out[r] + t, tail, static_cast<size_t>(n) * sizeof(float));
      }
    }
  } else if constexpr (kTokens == 1 && kRows == 4) {
    // AVX2's step of one token, a run's last after its steps of 3.
    const auto s = lane_sums4(acc[0][0], acc[1][0], acc[2][0], acc[3][0]);
    out[0][t] = hn::ExtractLane(s, 0);
    out[1][t] = hn::ExtractLane(s, 1);
    out[2][t] = hn::ExtractLane(s, 2);
    out[3][t] = hn::ExtractLane(s, 3);
  } else if constexpr (kTokens == 2) {
    static_assert(kRows % 2 == 0 || kRows == 1, "rows pair up two tokens at a time");
    if constexpr (kRows == 1) {
      const auto s = lane_sums4(acc[0][0], acc[0][1], acc[0][0], acc[0][1]);
      hn::Store(s, d4, tail);
      std::memcpy(out[0] + t, tail, static_cast<size_t>(n) * sizeof(float));
    } else {
      const hn::Half<decltype(d4)> d2;
      for (int r = 0; r < kRows; r += 2) {
        const auto s = lane_sums4(acc[r][0], acc[r][1], acc[r + 1][0], acc[r + 1][1]);
        if (HWY_LIKELY(n == 2)) {
          hn::StoreU(hn::LowerHalf(d2, s), d2, out[r] + t);
          hn::StoreU(hn::UpperHalf(d2, s), d2, out[r + 1] + t);
        } else {
          hn::Store(s, d4, tail);
          out[r][t] = tail[0];
          out[r + 1][t] = tail[2];
        }
      }
    }
  } else {
    static_assert(kTokens < 0, "steps of 4, 2, and on AVX2 4 x 3 and 4 x 1");
  }
#endif
}

// out[r][t] = q[r] . k[t] for kRows rows and the n key rows k[0 .. n) (of T:
// rows of the cache read in place, or of a converted tile), score_tokens(kRows)
// tokens per step: each loaded K vector feeds kRows FMAs, each loaded q vector
// one per token of the step, and one horizontal tree per four scores remains.
// kLinesPerToken > 0: that many cache lines per token are requested as it goes.
// AVX2 scores every group so: rows in the lanes from GQA 8 (q transposed, each
// key element broadcast against a vector of 8 rows, no horizontal sum) took
// more time on AMD Zen 5 at every width measured (one thread, 2048 tokens, K/V
// in L3, this order's time: fp16 GQA 8 0.87-0.91x with one query row,
// 0.93-0.96x with four, head_dim 64 0.96-0.98x, GQA 16 0.98-1.00x, GQA 32
// 0.89-0.95x, latent attention with 16 and 32 heads 0.92x and with 128
// 0.87-0.88x; 8 x 4096 tokens on 2 threads: GQA 8 0.86x with one query row,
// 0.96x with four, latent attention 0.89-0.92x).
template <typename T, int kD, int kRows, int kTok, int64_t kLinesPerToken>
HWY_INLINE void score_step(const float* HWY_RESTRICT const* qr, const T* HWY_RESTRICT const* kt,
                           float* const* HWY_RESTRICT out, int64_t t, int64_t count, LinePrefetch& prefetch,
                           bool room = false) {
  const DF df;
  constexpr int64_t kLanes = static_cast<int64_t>(hn::MaxLanes(df));
  constexpr int64_t kVecs = kD / kLanes;
  if constexpr (kLinesPerToken > 0) prefetch.step<kTok * kLinesPerToken>();
  VF acc[kRows][kTok];
  if constexpr (kPairedOrder<T> && kWideTarget) {
    static_assert(kVecs % 2 == 0, "whole pairs of vectors");
    for (int64_t v = 0; v < kVecs; v += 2) {
      VF x0[kTok], x1[kTok];
      for (int j = 0; j < kTok; ++j) load_f32_pair(kt[j] + v * kLanes, x0[j], x1[j]);
      for (int r = 0; r < kRows; ++r) {
        const VF q0 = hn::LoadU(df, qr[r] + v * kLanes);
        const VF q1 = hn::LoadU(df, qr[r] + (v + 1) * kLanes);
        for (int j = 0; j < kTok; ++j) {
          acc[r][j] = v == 0 ? hn::Mul(q0, x0[j]) : hn::MulAdd(q0, x0[j], acc[r][j]);
          acc[r][j] = hn::MulAdd(q1, x1[j], acc[r][j]);
        }
      }
    }
    store_scores<kRows, kTok>(acc, out, t, count, room);
    return;
  }
  {
    VF x[kTok];
    for (int j = 0; j < kTok; ++j) x[j] = load_vector(kt[j], 0);
    for (int r = 0; r < kRows; ++r) {
      const VF qv = hn::LoadU(df, qr[r]);
      for (int j = 0; j < kTok; ++j) acc[r][j] = hn::Mul(qv, x[j]);
    }
  }
  for (int64_t v = 1; v < kVecs; ++v) {
    VF x[kTok];
    for (int j = 0; j < kTok; ++j) x[j] = load_vector(kt[j], v);
    for (int r = 0; r < kRows; ++r) {
      const VF qv = hn::LoadU(df, qr[r] + v * kLanes);
      for (int j = 0; j < kTok; ++j) acc[r][j] = hn::MulAdd(qv, x[j], acc[r][j]);
    }
  }
  store_scores<kRows, kTok>(acc, out, t, count, room);
}

template <typename T, int kD, int kRows, int64_t kLinesPerToken, class Rows>
HWY_NOINLINE void score_rows(const float* const* HWY_RESTRICT q, Rows k, int64_t n, float* const* HWY_RESTRICT out,
                             LinePrefetch& prefetch) {
  constexpr int kTok = score_tokens(kRows);
  const float* HWY_RESTRICT qr[kRows];
  for (int r = 0; r < kRows; ++r) qr[r] = q[r];
  const T* HWY_RESTRICT kt[kTok];
  int64_t t = 0;
  if constexpr (kTok == 3) {
    // Steps of 3, then one of 2 or 1 for what is left: a block's 16 tokens take
    // 3+3+3+3+3+1, where a tail step of 3 scored dropped copies and two steps
    // of 2 for the last four tokens took 1.05x the time (AMD Zen 5, fp16 GQA 4,
    // one thread, head_dim 64). The step of 1 first, so that its four
    // chains (bound by their latency) overlap the steps of 3 after them, took
    // 1.01-1.02x the time with one query row and was level with four (8 x 4096
    // tokens, fp16 GQA 4, 2 threads, 6 alternating runs).
    for (; t + 3 <= n; t += 3) {
      for (int j = 0; j < 3; ++j) kt[j] = k[t + j];
      score_step<T, kD, kRows, 3, kLinesPerToken>(qr, kt, out, t, 3, prefetch, n - t > 3);
    }
    if (t + 2 <= n) {
      const T* HWY_RESTRICT pair[2] = {k[t], k[t + 1]};
      score_step<T, kD, kRows, 2, kLinesPerToken>(qr, pair, out, t, 2, prefetch);
      t += 2;
    }
    if (t < n) {
      const T* HWY_RESTRICT one[1] = {k[t]};
      score_step<T, kD, kRows, 1, kLinesPerToken>(qr, one, out, t, 1, prefetch);
      t += 1;
    }
  } else {
    for (; t + kTok <= n; t += kTok) {
      for (int j = 0; j < kTok; ++j) kt[j] = k[t + j];
      score_step<T, kD, kRows, kTok, kLinesPerToken>(qr, kt, out, t, kTok, prefetch);
    }
  }
  if (t < n) {
    // A tail shorter than a step repeats the last token; its scores are dropped.
    for (int j = 0; j < kTok; ++j) kt[j] = k[std::min<int64_t>(t + j, n - 1)];
    score_step<T, kD, kRows, kTok, kLinesPerToken>(qr, kt, out, t, n - t, prefetch);
  }
}

// ---- scores of quad rows (AVX-512, groups of 8 and wider) ----------------------

// On AVX-512, from GQA 8 up, a vector holds four rows x four consecutive
// elements of head_dim (lane 4r + s: row r, element 4v + s of step v): q
// packed once per task, each step's four key elements replicated into every
// 128-bit block by the load (a broadcast; for fp16 a broadcast and one
// conversion), one FMA per row block and token. A score is four chains
// (elements s, s + 4, ...) summed in one fixed tree inside its 128-bit block:
// no lane-crossing sums, and each key read once for four row blocks, where
// score_rows reduces 16-lane vectors (a fifth of its time) and reads the keys
// once per block of four rows (one thread, 16 rows against 128 fp16 keys in
// L1: 0.90-0.93 of the FMA peak, score_rows's order 0.75-0.78). Measured on
// AMD Zen 5, 2 threads, fp16 GQA 8, 8 x 4096 tokens: four query rows
// 0.92-0.94x the time, one level. Wider groups take them too, where rows in
// the lanes (q transposed, each key element broadcast against a vector of 16
// rows) had scored: one thread, 2048 tokens, K/V in L3, fp16 GQA 16 0.90-0.94x
// the time, GQA 32 0.93-1.00x, latent attention (576-wide rows) with 16 heads
// 0.78-0.79x, 32 0.91-0.92x (bf16 on the FMAs), 64 and 128 0.92-0.97x; 8 x
// 4096 tokens on 2 threads, latent attention's 32 bf16 heads 0.85-0.88x. With
// one block (GQA 4 and one query row) each replicated key feeds a single FMA:
// 1.16x the time there, so GQA 4 keeps score_rows's order for every row count
// in deterministic mode (a draft row has the bits of its single-step decode).
// In fast mode, whose bits may differ between batches, a task of more than
// two row blocks takes quads whatever its group (batch_invariant): fp16 GQA 4
// with four query rows 0.88-0.91x the time, three 0.95-0.97x, two level (one
// thread, 2048 tokens). Otherwise the choice depends on the group alone; a
// score depends on its row's q and key only, whatever the blocking, the other
// rows or the positions.
#if HWY_TARGET == HWY_AVX3 || HWY_TARGET == HWY_AVX3_DL
constexpr bool kQuadScores = true;
#else
constexpr bool kQuadScores = false;
#endif
constexpr int32_t kQuadMinGroup = 8;
constexpr int kQuadRows = 4;    // rows per vector (and per row block)
constexpr int kQuadBlocks = 4;  // row blocks per step at most: 16 accumulators
constexpr int kQuadTokens = 4;  // tokens per step: 16 lines of fp16 keys requested at a time

#if HWY_TARGET == HWY_AVX3 || HWY_TARGET == HWY_AVX3_DL
// q of the task's rows packed by blocks of four rows: block b, step v, lane
// 4r + s holds element 4v + s of row 4b + r (zero past the rows).
template <int kD>
HWY_NOINLINE void pack_q_quads(const PartialTask& t, int32_t rows, float* HWY_RESTRICT qp) {
  const int32_t blocks = (rows + kQuadRows - 1) / kQuadRows;
  std::fill(qp, qp + static_cast<int64_t>(blocks) * kQuadRows * kD, 0.f);
  for (int32_t r = 0; r < rows; ++r) {
    const float* q = t.position[r / t.heads].q + static_cast<int64_t>(r % t.heads) * kD;
    float* out = qp + static_cast<int64_t>(r / kQuadRows) * kQuadRows * kD + (r % kQuadRows) * 4;
    for (int64_t v = 0; v < kD / 4; ++v) std::copy(q + 4 * v, q + 4 * v + 4, out + 16 * v);
  }
}

// Elements p[0 .. 4) as fp32, in every 128-bit block of the vector.
template <typename T>
HWY_INLINE VF load_quad(const T* HWY_RESTRICT p) {
  if constexpr (std::is_same_v<T, float>) {
    return VF{_mm512_broadcast_f32x4(_mm_loadu_ps(p))};
  } else {
    static_assert(sizeof(T) == 2, "fp32, fp16 or bf16 elements");
    int64_t bits;
    std::memcpy(&bits, p, sizeof(bits));
    if constexpr (std::is_same_v<T, hwy::float16_t>) {
      return VF{_mm512_cvtph_ps(_mm256_set1_epi64x(bits))};
    } else {
      // Each bf16 in the top half of its 32-bit lane: the fp32 of the same value.
      return VF{_mm512_castsi512_ps(_mm512_unpacklo_epi16(_mm512_setzero_si512(), _mm512_set1_epi64(bits)))};
    }
  }
}

// The four chains of each lane group of a0..a3 summed, (s0 + s2) + (s1 + s3):
// block r of the result holds row r's sums for the four inputs in order.
HWY_INLINE VF quad_sums4(VF a0, VF a1, VF a2, VF a3) {
  const DF df;
  const hn::Repartition<double, DF> dd;
  const VF s01 = hn::Add(hn::InterleaveLower(df, a0, a1), hn::InterleaveUpper(df, a0, a1));
  const VF s23 = hn::Add(hn::InterleaveLower(df, a2, a3), hn::InterleaveUpper(df, a2, a3));
  return hn::Add(hn::BitCast(df, hn::InterleaveLower(dd, hn::BitCast(dd, s01), hn::BitCast(dd, s23))),
                 hn::BitCast(df, hn::InterleaveUpper(dd, hn::BitCast(dd, s01), hn::BitCast(dd, s23))));
}

// Scores of kBlocks row blocks (packed q at qp, blocks kQuadRows * kD apart)
// against the kQuadTokens keys kt[], written to out[r][t + j] for the blocks'
// rows r (kBlocks * 4 row pointers) and j < count.
template <typename T, int kD, int kBlocks>
HWY_INLINE void quad_step(const float* HWY_RESTRICT qp, const T* HWY_RESTRICT const* kt, float* const* HWY_RESTRICT out,
                          int64_t t, int64_t count) {
  const DF df;
  constexpr int kTok = kQuadTokens;
  static_assert(kTok == 4, "quad_sums4 meets four tokens");
  constexpr int64_t kBlockFloats = kQuadRows * kD;
  VF acc[kBlocks][kTok];
  {
    VF x[kTok];
    for (int j = 0; j < kTok; ++j) x[j] = load_quad(kt[j]);
    for (int b = 0; b < kBlocks; ++b) {
      const VF q = hn::Load(df, qp + b * kBlockFloats);
      for (int j = 0; j < kTok; ++j) acc[b][j] = hn::Mul(q, x[j]);
    }
  }
#pragma GCC unroll 4
  for (int64_t v = 1; v < kD / 4; ++v) {
    VF x[kTok];
    for (int j = 0; j < kTok; ++j) x[j] = load_quad(kt[j] + 4 * v);
    for (int b = 0; b < kBlocks; ++b) {
      const VF q = hn::Load(df, qp + b * kBlockFloats + 16 * v);
      for (int j = 0; j < kTok; ++j) acc[b][j] = hn::MulAdd(q, x[j], acc[b][j]);
    }
  }
  const hn::Full128<float> d4;
  for (int b = 0; b < kBlocks; ++b) {
    HWY_ALIGN float sums[16];
    hn::Store(quad_sums4(acc[b][0], acc[b][1], acc[b][2], acc[b][3]), df, sums);
    for (int r = 0; r < kQuadRows; ++r) {
      float* row = out[b * kQuadRows + r] + t;
      if (HWY_LIKELY(count == kTok)) {
        hn::StoreU(hn::Load(d4, sums + 4 * r), d4, row);
      } else {
        std::memcpy(row, sums + 4 * r, static_cast<size_t>(count) * sizeof(float));
      }
    }
  }
}

// The scores of kBlocks row blocks over the n keys k[0 .. n): steps of
// kQuadTokens tokens (steps of 8 with one or two blocks requested twice the
// lines at a time and measured 1.05-1.15x the time, memory-bound), a tail
// shorter than a step repeating the last key (its scores dropped).
// kLinesPerToken > 0: that many lines per token requested as it goes.
template <typename T, int kD, int kBlocks, int64_t kLinesPerToken, class Rows>
HWY_NOINLINE void score_quad_blocks(const float* HWY_RESTRICT qp, Rows k, int64_t n, float* const* HWY_RESTRICT out,
                                    LinePrefetch& prefetch) {
  constexpr int kTok = kQuadTokens;
  const T* HWY_RESTRICT kt[kTok];
  for (int64_t t = 0; t < n; t += kTok) {
    if constexpr (kLinesPerToken > 0) prefetch.step<kTok * kLinesPerToken>();
    for (int j = 0; j < kTok; ++j) kt[j] = k[std::min<int64_t>(t + j, n - 1)];
    quad_step<T, kD, kBlocks>(qp, kt, out, t, std::min<int64_t>(kTok, n - t));
  }
}

// All rows' scores over the stretch k[0 .. n), into out[r][0 .. n) (rows up
// to the next multiple of 4 written: the padding rows' scores are zero): four
// row blocks at a time, the first four requesting the stretch's lines.
template <typename T, int kD, int64_t kLinesPerToken, class Rows>
HWY_INLINE void score_quads(const float* HWY_RESTRICT qp, int32_t rows, Rows k, int64_t n,
                            float* const* HWY_RESTRICT out, LinePrefetch& prefetch) {
  const int32_t blocks = (rows + kQuadRows - 1) / kQuadRows;
  constexpr int64_t kBlockFloats = kQuadRows * kD;
  int32_t b = 0;
  const auto run = [&](auto count, auto lines) {
    constexpr int kBlocks = decltype(count)::value;
    score_quad_blocks<T, kD, kBlocks, decltype(lines)::value>(qp + b * kBlockFloats, k, n, out + b * kQuadRows,
                                                              prefetch);
    b += kBlocks;
  };
  // The next up to kQuadBlocks blocks, requesting `lines` lines per token.
  const auto next = [&](auto lines) {
    const int32_t left = blocks - b;
    if (left >= kQuadBlocks) return run(std::integral_constant<int, kQuadBlocks>(), lines);
    if (left == 3) return run(std::integral_constant<int, 3>(), lines);
    if (left == 2) return run(std::integral_constant<int, 2>(), lines);
    run(std::integral_constant<int, 1>(), lines);
  };
  next(std::integral_constant<int64_t, kLinesPerToken>());
  while (b < blocks) next(std::integral_constant<int64_t, 0>());
}
#endif

// 2^x for x <= 0 (a score minus its row max), vectorised: Highway 1.0.3 has
// no Exp2. x = n + f with f in [-0.5, 0.5]; 2^f from its degree-7 Taylor series
// (truncation 5e-9, below fp32 rounding); 2^n built in the exponent bits,
// or on AVX-512 applied by VSCALEFPS (n rounded in place: 13 instructions
// where the bits took 17; the same product, exact or rounded once alike;
// AMD Zen 5, 2 threads, bf16 GQA 4 with four query rows: 0.96x the time).
// Terms under 2^-126 of the row max, and -inf (masked keys), give exactly 0.
HWY_INLINE VF exp2_nonpositive(VF x) {
  const DF d;
  const auto underflow = hn::Lt(x, hn::Set(d, -126.f));
  x = hn::Max(x, hn::Set(d, -126.f));
#if HWY_TARGET == HWY_AVX3 || HWY_TARGET == HWY_AVX3_DL
  const VF n = hn::Round(x);
  const VF f = hn::Sub(x, n);
#else
  // x + 1.5 * 2^23 holds round(x) (nearest-even, as NearestInt) in its low
  // significand bits: its bits are 0x4B400000 + n for n in [-126, 0], whose
  // high bits the shift below drops. Two adds where NearestInt's fix-up of
  // out-of-range lanes (none here) and the conversion back took six; n and f
  // equal theirs for every float in [-126, 0] (checked exhaustively). AMD Zen
  // 5, fp16 GQA 4, one thread, 2048 tokens: head_dim 64 0.97-0.98x the time,
  // 128 0.98-0.99x.
  const hn::RebindToSigned<DF> di;
  const VF magic = hn::Set(d, 12582912.f);
  const VF shifted = hn::Add(x, magic);
  const auto n_bits = hn::BitCast(di, shifted);  // 0x4B400000 + n
  const auto f = hn::Sub(x, hn::Sub(shifted, magic));
#endif
  auto p = hn::Set(d, 1.5252733804059841e-05f);
  p = hn::MulAdd(p, f, hn::Set(d, 1.5403530393381608e-04f));
  p = hn::MulAdd(p, f, hn::Set(d, 1.3333558146428443e-03f));
  p = hn::MulAdd(p, f, hn::Set(d, 9.6181291076284772e-03f));
  p = hn::MulAdd(p, f, hn::Set(d, 5.5504108664821580e-02f));
  p = hn::MulAdd(p, f, hn::Set(d, 2.4022650695910071e-01f));
  p = hn::MulAdd(p, f, hn::Set(d, 6.9314718055994531e-01f));
  p = hn::MulAdd(p, f, hn::Set(d, 1.f));
#if HWY_TARGET == HWY_AVX3 || HWY_TARGET == HWY_AVX3_DL
  return hn::IfThenZeroElse(underflow, VF{_mm512_scalef_ps(p.raw, n.raw)});
#else
  const auto scale = hn::BitCast(d, hn::ShiftLeft<23>(hn::Add(n_bits, hn::Set(di, 127))));
  return hn::IfThenZeroElse(underflow, hn::Mul(p, scale));
#endif
}

// The lanes of v summed in a fixed tree, whichever compiler built it: on
// AVX-512 lane i with i + 8, then i with i + 4, i with i + 2, 0 with 1 (the
// order GCC's _mm512_reduce_add_ps takes; softmax_keys sums rows-in-lanes
// vectors in the same pairs, so the two forms of the softmax give a row the
// same bits). Elsewhere Highway's sum.
HWY_INLINE float sum_lanes(VF v) {
#if HWY_TARGET == HWY_AVX3 || HWY_TARGET == HWY_AVX3_DL
  const hn::Half<DF> d8;
  const hn::Half<decltype(d8)> d4;
  const auto v8 = hn::Add(hn::LowerHalf(d8, v), hn::UpperHalf(d8, v));
  const auto v4 = hn::Add(hn::LowerHalf(d4, v8), hn::UpperHalf(d4, v8));
  const auto v2 = hn::Add(v4, hn::Shuffle1032(v4));  // lanes 0 + 2, 1 + 3
  return hn::GetLane(hn::Add(v2, hn::Shuffle2301(v2)));
#else
  return hn::GetLane(hn::SumOfLanes(DF(), v));
#endif
}

// Row scores s[first, end) (relative to the sub-block) become softmax weights
// 2^(s - m) in place; returns the row's (m, l). Lanes hold fixed positions:
// the loop runs over the vectors that cover [first, end), the lanes outside it
// are set to -inf (weight 0), so a row has these bits whatever other rows or
// positions its task holds. soft_cap > 0: s = cap * tanh(s / cap) * log2(e) first.
HWY_INLINE SoftmaxStats<float> softmax_row(float* HWY_RESTRICT s, int64_t first, int64_t end, float soft_cap) {
  const DF df;
  constexpr int64_t kLanes = static_cast<int64_t>(hn::MaxLanes(df));
  SoftmaxStats<float> st;
  if (first >= end) return st;
  const int64_t lo = first / kLanes * kLanes;
  const int64_t hi = (end + kLanes - 1) / kLanes * kLanes;
  if (soft_cap > 0.f) {
    const VF inv_cap = hn::Set(df, 1.f / soft_cap);
    const VF cap_log2 = hn::Set(df, soft_cap * static_cast<float>(kLog2e));
    for (int64_t i = lo; i < hi; i += kLanes) {
      hn::Store(hn::Mul(cap_log2, hn::Tanh(df, hn::Mul(hn::Load(df, s + i), inv_cap))), df, s + i);
    }
  }
  for (int64_t i = lo; i < first; ++i) s[i] = neg_inf<float>();
  for (int64_t i = end; i < hi; ++i) s[i] = neg_inf<float>();
  VF vmax = hn::Load(df, s + lo);
  for (int64_t i = lo + kLanes; i < hi; i += kLanes) vmax = hn::Max(vmax, hn::Load(df, s + i));
  st.m = hn::GetLane(hn::MaxOfLanes(df, vmax));
  if (st.m == neg_inf<float>()) return {};
  const VF vm = hn::Set(df, st.m);
  VF vsum = hn::Zero(df);
  int64_t i = lo;
  // Four exponentials side by side, each a chain of dependent FMAs, so the
  // chains overlap in the core's window (bf16 GQA 4 with four query rows,
  // cache-resident: 0.99x the time; two on AVX2, whose 16 registers spill
  // the four's constants, measured level). The sum still adds them in order
  // (the same bits).
  for (; i + 4 * kLanes <= hi; i += 4 * kLanes) {
    VF p[4];
    for (int j = 0; j < 4; ++j) p[j] = exp2_nonpositive(hn::Sub(hn::Load(df, s + i + j * kLanes), vm));
    for (int j = 0; j < 4; ++j) {
      hn::Store(p[j], df, s + i + j * kLanes);
      vsum = hn::Add(vsum, p[j]);
    }
  }
  for (; i < hi; i += kLanes) {
    const VF p = exp2_nonpositive(hn::Sub(hn::Load(df, s + i), vm));
    hn::Store(p, df, s + i);
    vsum = hn::Add(vsum, p);
  }
  st.l = sum_lanes(vsum);
  return st;
}

// ---- P.V -----------------------------------------------------------------------

// acc[r] += sum over t in [a, b) of p[r][t] * v[t], for kRows rows and all of kD
// in steps of pv_vectors(kRows) vectors and a narrower last one where they do
// not tile kD (v[t]: a V row, of which the first kD
// elements are read: a row of the cache, the prefix of K's row under latent
// attention, or a row of a converted tile). Each loaded V vector feeds kRows
// FMAs; the weights are broadcast from memory. Where one step covers kD the
// sums stay in registers over all of [a, b); else tokens go kPvChunkTokens at
// a time through every step, so the steps after the first read the chunk's
// rows from L1. Tokens go in order, one FMA chain per (row, vector): the bits
// depend on the row's own keys only. `lines` cache lines per token are
// requested, each step its share. A call over a stretch requests them every
// kPvBurstTokens tokens, the score loop's pace (one burst per 16 tokens
// measured 4-9% slower where the reads are the limit: AMD Zen 5, 2 threads,
// fp16 8 x 4096 tokens, head_dim 64); a call of one run or tile takes each step
// over all of it, with one burst at its start. With `first` the sums start
// from zero (acc is written, not read): a row's first call of a sub-block, so
// that no fill of the accumulators precedes it (AMD Zen 5, AVX2, fp16 GQA 8:
// the fill was 2% of a profile; paired runs level within their noise).
constexpr int64_t kPvChunkTokens = 64;
constexpr int64_t kPvBurstTokens = 4;
template <typename T, int kD, int kRows, class Rows>
HWY_NOINLINE void accumulate_rows(const float* const* HWY_RESTRICT p, Rows v, int64_t a, int64_t b,
                                  float* const* HWY_RESTRICT acc, LinePrefetch& prefetch, int64_t lines,
                                  bool first) {
  const DF df;
  constexpr int64_t kLanes = static_cast<int64_t>(hn::MaxLanes(df));
  constexpr int64_t kVecs = kD / kLanes;
  constexpr int64_t kStep = pv_vectors(kRows) < kVecs ? pv_vectors(kRows) : kVecs;
  static_assert(!kPairedOrder<T> || kVecs % 2 == 0, "whole pairs of vectors");
  const float* HWY_RESTRICT pr[kRows];
  float* HWY_RESTRICT ar[kRows];
  for (int r = 0; r < kRows; ++r) {
    pr[r] = p[r];
    ar[r] = acc[r];
  }
  // Sums stay in registers over a whole chunk: all of [a, b) where one step
  // covers kD.
  constexpr int64_t kChunk = kStep == kVecs || !Rows::kStretch ? kSubBlockTokens : kPvChunkTokens;
  constexpr int64_t kBurst = Rows::kStretch ? kPvBurstTokens : kSubBlockTokens;
  // One step: vectors [v0, v0 + kWidth) of every row over the chunk's tokens.
  const auto step = [&](auto width, int64_t v0, int64_t t0, int64_t t1) {
    constexpr int64_t kWidth = decltype(width)::value;
    VF sum[kRows][kWidth];
    const bool zero = first && t0 == a;
    for (int r = 0; r < kRows; ++r) {
      for (int64_t c = 0; c < kWidth; ++c) sum[r][c] = zero ? hn::Zero(df) : hn::Load(df, ar[r] + (v0 + c) * kLanes);
    }
    // Tokens [u0, u1), token t's row at row_of(t).
    const auto tokens = [&](int64_t u0, int64_t u1, const auto& row_of) HWY_ATTR {
      for (int64_t s0 = u0; s0 < u1; s0 += kBurst) {
        const int64_t s1 = std::min(u1, s0 + kBurst);
        // Each step reads kWidth / kVecs of every row: that share of its lines.
        if (lines > 0) prefetch.step((lines * (s1 - s0) * kWidth + kVecs - 1) / kVecs);
#pragma GCC unroll 2
        for (int64_t t = s0; t < s1; ++t) {
          const T* HWY_RESTRICT whole = row_of(t);
          const T* HWY_RESTRICT row = whole + v0 * kLanes;
          VF x[kWidth];
          if constexpr (kPairedOrder<T> && kStep % 2 != 0) {
            // Steps of three vectors (AVX2) start on either half of a pair.
            for (int64_t c = 0; c < kWidth; ++c) x[c] = load_vector(whole, v0 + c);
          } else if constexpr (kPairedOrder<T>) {
            for (int64_t c = 0; c < kWidth; c += 2) load_f32_pair(row + c * kLanes, x[c], x[c + 1]);
          } else {
            for (int64_t c = 0; c < kWidth; ++c) x[c] = load_f32(row + c * kLanes);
          }
          for (int r = 0; r < kRows; ++r) {
            const VF w = hn::Set(df, pr[r][t]);
            for (int64_t c = 0; c < kWidth; ++c) sum[r][c] = hn::MulAdd(w, x[c], sum[r][c]);
          }
        }
      }
    };
    if constexpr (std::is_same_v<Rows, RunList<T>>) {
      for (int32_t i = 0; i < v.runs; ++i) {
        const int64_t u0 = std::max(t0, v.begin[i]);
        const int64_t u1 = std::min(t1, v.begin[i + 1]);
        if (u0 >= u1) continue;
        const T* HWY_RESTRICT run = v.first[i];
        const int64_t at = v.begin[i];
        const int64_t stride = v.stride;
        tokens(u0, u1, [&](int64_t t) { return run + (t - at) * stride; });
      }
    } else {
      tokens(t0, t1, [&](int64_t t) { return v[t]; });
    }
    for (int r = 0; r < kRows; ++r)
      for (int64_t c = 0; c < kWidth; ++c) hn::Store(sum[r][c], df, ar[r] + (v0 + c) * kLanes);
  };
  for (int64_t t0 = a; t0 < b; t0 += kChunk) {
    const int64_t t1 = std::min(b, t0 + kChunk);
    int64_t v0 = 0;
    for (; v0 + kStep <= kVecs; v0 += kStep) step(std::integral_constant<int64_t, kStep>(), v0, t0, t1);
    if constexpr (kVecs % kStep != 0) step(std::integral_constant<int64_t, kVecs % kStep>(), v0, t0, t1);
  }
}

// ---- the task ------------------------------------------------------------------

// Row r = (position, head) of the task writes its state at this index.
HWY_INLINE int64_t state_index(const PartialTask& t, int32_t r) {
  return t.position[r / t.heads].partial + r % t.heads;
}

// Every row's state starts empty: m = -inf, l = 0, its acc left as it is:
// merges never read the acc of an empty state (merge_into copies over it, the
// launch's merge skips it). At a latent head's 512 elements for up to 128 rows
// a fill would be a pass over 256 KiB per task; on four rows at head_dim 128
// it was 0.6% of a profile's samples (AMD Zen 3, AVX2, one thread, fp16 GQA 4
// with one query row), all in the fill's `rep stos`. With sinks, each row
// starts from its head's sink instead: m = sink, l = 1, acc = 0.
HWY_INLINE void reset_states(const PartialTask& t, int64_t dv) {
  for (int32_t r = 0; r < t.positions * t.heads; ++r) {
    const int64_t i = state_index(t, r);
    if (t.sinks != nullptr) {
      t.m[i] = t.sinks[r % t.heads];
      t.l[i] = 1.f;
      std::fill(t.acc + i * dv, t.acc + (i + 1) * dv, 0.f);
      continue;
    }
    t.m[i] = neg_inf<float>();
    t.l[i] = 0.f;
  }
}

// Each position's keys in sub-block sb, and its rows' weights in place of
// their scores (rows kSubBlockTokens apart). P.V then starts every row's sums
// from zero itself.
HWY_INLINE void softmax_sub_block(const PartialTask& t, const ReadPlan& plan, int64_t sb, float* scores,
                                  SoftmaxStats<float>* stats) {
  const int64_t base = t.chunk_begin + sb * kSubBlockTokens;
  for (int32_t p = 0; p < t.positions; ++p) {
    const ReadPlan::Span keys = plan.keys_of(p, sb);
    for (int32_t h = 0; h < t.heads; ++h) {
      const int32_t r = p * t.heads + h;
      stats[r] = softmax_row(scores + static_cast<int64_t>(r) * kSubBlockTokens, keys.begin - base, keys.end - base,
                             t.soft_cap);
    }
  }
}

// rows x dv sums (dv a multiple of two vectors) from the paired order back
// into element order, in place, before they merge.
HWY_INLINE void from_paired_order(float* HWY_RESTRICT acc, int32_t rows, int64_t dv) {
#if HWY_TARGET == HWY_AVX3 || HWY_TARGET == HWY_AVX3_DL
  // Lane i of the first vector: element i / 2 of the even ones (i even) or of
  // the odd ones (i odd), which _mm512_permutex2var_ps indexes from 16 on.
  const __m512i first = _mm512_setr_epi32(0, 16, 1, 17, 2, 18, 3, 19, 4, 20, 5, 21, 6, 22, 7, 23);
  const __m512i second = _mm512_add_epi32(first, _mm512_set1_epi32(8));
  const int64_t n = rows * dv;
  for (int64_t i = 0; i < n; i += 32) {
    const __m512 even = _mm512_loadu_ps(acc + i);
    const __m512 odd = _mm512_loadu_ps(acc + i + 16);
    _mm512_storeu_ps(acc + i, _mm512_permutex2var_ps(even, first, odd));
    _mm512_storeu_ps(acc + i + 16, _mm512_permutex2var_ps(even, second, odd));
  }
#elif HWY_TARGET == HWY_AVX2
  // Per 128-bit half, the interleaves give e0 o0 e1 o1 | e4 o4 e5 o5 and
  // e2 o2 e3 o3 | e6 o6 e7 o7; their low and high halves joined are the order.
  const DF df;
  const int64_t n = rows * dv;
  for (int64_t i = 0; i < n; i += 16) {
    const VF even = hn::LoadU(df, acc + i);
    const VF odd = hn::LoadU(df, acc + i + 8);
    const VF lo = hn::InterleaveLower(df, even, odd);
    const VF hi = hn::InterleaveUpper(df, even, odd);
    hn::StoreU(hn::ConcatLowerLower(df, hi, lo), df, acc + i);
    hn::StoreU(hn::ConcatUpperUpper(df, hi, lo), df, acc + i + 8);
  }
#else
  (void)acc, (void)rows, (void)dv;
#endif
}

// The sub-block's states join the task's, sub-blocks in position order.
HWY_INLINE void merge_sub_block(const PartialTask& t, const SoftmaxStats<float>* stats, const float* sub_acc,
                                int64_t dv) {
  for (int32_t r = 0; r < t.positions * t.heads; ++r) {
    const int64_t i = state_index(t, r);
    SoftmaxStats<float> running{t.m[i], t.l[i]};
    merge_state(running, t.acc + i * dv, stats[r], sub_acc + r * dv, static_cast<int>(dv));
    t.m[i] = running.m;
    t.l[i] = running.l;
  }
}

template <typename T>
constexpr bool kIsFp8 = std::is_same_v<T, Fp8E4M3Bits> || std::is_same_v<T, Fp8E5M2Bits>;
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
      kQuadScores && (g.group_size() >= kQuadMinGroup || (!t.batch_invariant && rows > 2 * kQuadRows));

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
  // Quad scores read a 16- or 32-bit cache in place whatever the rows (each
  // key once for four row blocks), an fp8 cache from the tile, and an fp16
  // one from the tile too where this CPU's family widens faster once
  // (fp16_shared_through_tile).
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
  const bool direct_k = quads ? !kIsFp8<T> && !fp16_tile : rows <= direct_rows;
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
#if HWY_TARGET == HWY_AVX3 || HWY_TARGET == HWY_AVX3_DL
  if (quads) pack_q_quads<kD>(t, rows, q_packed);
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
#if HWY_TARGET == HWY_AVX3 || HWY_TARGET == HWY_AVX3_DL
      if (quads) {
        float* quad_outs[kMaxTaskRows];
        for (int64_t r = 0; r < rows4; ++r) quad_outs[r] = scores + r * kSubBlockTokens + (pos - base);
        with_rows(from, std::integral_constant<int, kD>(), [&](auto keys) {
          using Element = typename decltype(keys)::Element;
          if constexpr (kIsFp8Bits<Element>) {
            HWY_ABORT("quad scores read fp8 keys from the tile only (direct_k)");
          } else {
            score_quads<Element, kD, kLinesPerRow>(q_packed, rows, keys, n, quad_outs, prefetch);
          }
        });
        prefetch.catch_up();
        pos += n;
        continue;
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

#if HWY_TARGET == HWY_AVX3
// n rows of kD elements, kStride apart, as bf16 into out ([n][kD]): exact for
// the fp8 caches (3 or 2 significand bits and their exponents fit bf16; e4m3
// reads 2^-8 of its value as everywhere, the launch folds 2^8 back in), so
// their tiles see the stored values.
template <typename T, int kD, int kStride>
HWY_INLINE void rows_to_bf16(const T* HWY_RESTRICT in, int64_t n, uint16_t* HWY_RESTRICT out, bool tables) {
  if constexpr (kIsFp8<T>) {
    if (tables) return fp8tab::rows_to_bf16(kFp8Format<T>, reinterpret_cast<const uint8_t*>(in), kStride, n, kD, out);
  }
  const DF df;
  const hn::Rebind<hwy::bfloat16_t, DF> dbf;
  constexpr int64_t kLanes = static_cast<int64_t>(hn::MaxLanes(df));
  for (int64_t r = 0; r < n; ++r, in += kStride, out += kD) {
    for (int64_t i = 0; i < kD; i += kLanes) {
      hn::StoreU(hn::DemoteTo(dbf, load_f32(in + i)), dbf, reinterpret_cast<hwy::bfloat16_t*>(out + i));
    }
  }
}

// The softmax of a block of 16 rows whose scores are key-major
// (s[16 j + r]: key j of the sub-block, row r), as the dot products leave
// them with the rows in the lanes: the weights replace the scores in place
// over keys [*first, *end) (whole vectors of 16 keys, set here; zero where a
// row does not attend the key), and rows r < live get their (m, l). Row r
// attends keys [begin[r], end_of[r]) of the sub-block (none where begin >=
// end). Each row has the bits softmax_row gives it from row-major scores:
// the max is exact in any order, each weight is the same function of its
// score and the row max, and the sum runs in softmax_row's order. There, lane
// i of a vector sum adds the keys j = i mod 16 in key order (a zero for each
// key outside the row: exact), and the 16 lanes meet in sum_lanes's tree
// (lanes i and i + 8, then i and i + 4, i and i + 2, 0 and 1); here sums[i]
// adds the same keys for every row at once and the 16 sums meet in the same
// pairs. Draft rows are compared bit for bit with their single-step decodes,
// which take the row-major form.
HWY_INLINE void softmax_keys(float* HWY_RESTRICT s, const int32_t* begin, const int32_t* end_of, int32_t live,
                             float soft_cap, SoftmaxStats<float>* stats, int64_t* first, int64_t* end) {
  const DF df;
  const hn::RebindToSigned<DF> di;
  static_assert(hn::MaxLanes(DF()) == bf16::kTileRows, "a row per lane");
  // Per row its keys (none: 0, 0) and whether it has any; over the rows that
  // do, the keys any of them attends [j0, j1) and those all attend
  // [all_lo, all_hi).
  alignas(64) int32_t lo[bf16::kTileRows];
  alignas(64) int32_t hi[bf16::kTileRows];
  alignas(64) int32_t attends[bf16::kTileRows];
  int32_t j0 = kSubBlockTokens;
  int32_t j1 = 0;
  int32_t all_lo = 0;
  int32_t all_hi = kSubBlockTokens;
  for (int32_t r = 0; r < bf16::kTileRows; ++r) {
    const bool has_keys = r < live && begin[r] < end_of[r];
    lo[r] = has_keys ? begin[r] : 0;
    hi[r] = has_keys ? end_of[r] : 0;
    attends[r] = has_keys ? -1 : 0;
    if (has_keys) {
      j0 = std::min(j0, begin[r]);
      j1 = std::max(j1, end_of[r]);
      all_lo = std::max(all_lo, begin[r]);
      all_hi = std::min(all_hi, end_of[r]);
    }
  }
  all_hi = std::max(all_hi, all_lo);
  *first = j0 / bf16::kTileRows * bf16::kTileRows;
  *end = j0 < j1 ? (j1 + bf16::kTileRows - 1) / bf16::kTileRows * bf16::kTileRows : *first;
  for (int32_t r = 0; r < live; ++r) stats[r] = {};
  if (*first >= *end) return;
  const auto vlo = hn::Load(di, lo);
  const auto vhi = hn::Load(di, hi);
  const auto attended = [&](int64_t j) {
    const auto vj = hn::Set(di, static_cast<int32_t>(j));
    return hn::RebindMask(df, hn::AndNot(hn::Lt(vj, vlo), hn::Lt(vj, vhi)));  // lo <= j < hi
  };
  if (soft_cap > 0.f) {
    const VF inv_cap = hn::Set(df, 1.f / soft_cap);
    const VF cap_log2 = hn::Set(df, soft_cap * static_cast<float>(kLog2e));
    for (int64_t j = *first; j < *end; ++j) {
      float* at = s + bf16::kTileRows * j;
      hn::Store(hn::Mul(cap_log2, hn::Tanh(df, hn::Mul(hn::Load(df, at), inv_cap))), df, at);
    }
  }
  // Keys every attending row attends take one fixed mask, the edges each
  // key's own: the mask tests are the loops' cost.
  const auto every = hn::RebindMask(df, hn::Ne(hn::Load(di, attends), hn::Zero(di)));
  const VF ninf = hn::Set(df, neg_inf<float>());
  VF vmax = ninf;
  for (int64_t j = *first; j < all_lo; ++j) {
    vmax = hn::Max(vmax, hn::IfThenElse(attended(j), hn::Load(df, s + bf16::kTileRows * j), ninf));
  }
  {
    VF part[4] = {ninf, ninf, ninf, ninf};
    int64_t j = all_lo;
    for (; j + 4 <= all_hi; j += 4) {
      for (int k = 0; k < 4; ++k) part[k] = hn::Max(part[k], hn::Load(df, s + bf16::kTileRows * (j + k)));
    }
    for (; j < all_hi; ++j) part[0] = hn::Max(part[0], hn::Load(df, s + bf16::kTileRows * j));
    vmax = hn::Max(vmax, hn::IfThenElse(every, hn::Max(hn::Max(part[0], part[1]), hn::Max(part[2], part[3])), ninf));
  }
  for (int64_t j = all_hi; j < *end; ++j) {
    vmax = hn::Max(vmax, hn::IfThenElse(attended(j), hn::Load(df, s + bf16::kTileRows * j), ninf));
  }
  // A row with no key keeps m = -inf; 0 in its place spares its (zeroed)
  // weights a NaN.
  const auto empty = hn::Eq(vmax, ninf);
  const VF vm = hn::IfThenZeroElse(empty, vmax);
  const auto weigh = [&](int64_t j, auto mask) {
    float* at = s + bf16::kTileRows * j;
    hn::Store(hn::IfThenElseZero(mask, exp2_nonpositive(hn::Sub(hn::Load(df, at), vm))), df, at);
  };
  for (int64_t j = *first; j < all_lo; ++j) weigh(j, attended(j));
  {
    // Four exponentials side by side, as softmax_row takes them.
    int64_t j = all_lo;
    for (; j + 4 <= all_hi; j += 4) {
      for (int k = 0; k < 4; ++k) weigh(j + k, every);
    }
    for (; j < all_hi; ++j) weigh(j, every);
  }
  for (int64_t j = all_hi; j < *end; ++j) weigh(j, attended(j));
  // sums[i]: keys j = i mod 16 in key order, four chains at a time (the
  // exponentials' constants leave too few registers to keep all 16 there).
  VF sums[bf16::kTileRows];
  for (int i0 = 0; i0 < bf16::kTileRows; i0 += 4) {
    VF part[4] = {hn::Zero(df), hn::Zero(df), hn::Zero(df), hn::Zero(df)};
    for (int64_t j0v = *first; j0v < *end; j0v += bf16::kTileRows) {
      for (int k = 0; k < 4; ++k) part[k] = hn::Add(part[k], hn::Load(df, s + bf16::kTileRows * (j0v + i0 + k)));
    }
    for (int k = 0; k < 4; ++k) sums[i0 + k] = part[k];
  }
  for (int i = 0; i < 8; ++i) sums[i] = hn::Add(sums[i], sums[i + 8]);
  for (int i = 0; i < 4; ++i) sums[i] = hn::Add(sums[i], sums[i + 4]);
  for (int i = 0; i < 2; ++i) sums[i] = hn::Add(sums[i], sums[i + 2]);
  const VF l = hn::Add(sums[0], sums[1]);
  alignas(64) float m_rows[bf16::kTileRows];
  alignas(64) float l_rows[bf16::kTileRows];
  hn::Store(vmax, df, m_rows);
  hn::Store(l, df, l_rows);
  for (int32_t r = 0; r < live; ++r) {
    if (m_rows[r] != neg_inf<float>()) stats[r] = {m_rows[r], l_rows[r]};
  }
}

// The two matrix units behind one interface: AMX tiles (amx_tiles.h) and
// AVX512-BF16 dot products (bf16_dot.h), on the same packed operands
// (bf16_blocks.h). The tiles work on all 16 rows of a block; the dot products
// skip the padding rows.
// Each unit's tasks request their lines at its own level (prefetch_levels.h).
struct AmxUnit {
  using Scope = amx::TileScope;
  static constexpr bool kPackedKeys = false;  // its tiles read keys as rows
  static constexpr bool kVInPlace = false;    // its tiles read packed V only
  static constexpr bool kKeyMajor = false;    // its scores come out row-major
  static PrefetchLevel prefetch_level(const PrefetchLevels& levels) { return levels.amx; }
  static void scores(const uint16_t* qb, int32_t d, const bf16::KeyRows* keys, int32_t groups, int32_t rows,
                     float scale, float* out, int64_t out_stride, bf16::Requests requests) {
    amx::scores(qb, d, keys, groups, rows, scale, out, out_stride, requests);
  }
  // Its blocks are never key-major: P is always row-major here.
  static constexpr bool kPvSpreadsRequests = false;  // accumulate takes no line requests
  static void accumulate(const uint16_t* pa, const uint16_t* vb, int32_t dv, float* acc, int64_t acc_stride,
                         int32_t /*rows*/, bool first, bf16::PLayout /*layout*/, bf16::Requests /*requests*/) {
    amx::accumulate(pa, vb, dv, acc, acc_stride, first);
  }
};
struct DotUnit {
  struct Scope {};  // no per-thread state
  static constexpr bool kPackedKeys = true;  // scores_packed below
  static constexpr bool kVInPlace = true;    // few rows: bf16dot / fp8tab::accumulate_in_place
  static constexpr bool kKeyMajor = true;     // 9 to 16 rows: scores_by_key below
  static PrefetchLevel prefetch_level(const PrefetchLevels& levels) { return levels.bf16_dot; }
  static void scores_by_key(const uint16_t* qb, int32_t d, const bf16::KeyRows* keys, int32_t groups, float scale,
                            float* out, bf16::Requests requests, const uint16_t* qb2 = nullptr,
                            float* out2 = nullptr) {
    bf16dot::scores_by_key(qb, d, keys, groups, scale, out, requests, qb2, out2);
  }
  static void scores(const uint16_t* qb, int32_t d, const bf16::KeyRows* keys, int32_t groups, int32_t rows,
                     float scale, float* out, int64_t out_stride, bf16::Requests requests) {
    bf16dot::scores(qb, d, keys, groups, rows, scale, out, out_stride, requests);
  }
  static void scores_packed(const uint16_t* qb, int32_t d, const bf16::KeyRows* keys, int32_t groups, int32_t rows,
                            float scale, float* out, int64_t out_stride, bf16::Requests requests) {
    bf16dot::scores_packed(qb, d, keys, groups, rows, scale, out, out_stride, requests);
  }
  static constexpr bool kPvSpreadsRequests = true;
  static void accumulate(const uint16_t* pa, const uint16_t* vb, int32_t dv, float* acc, int64_t acc_stride,
                         int32_t rows, bool first, bf16::PLayout layout, bf16::Requests requests) {
    bf16dot::accumulate(pa, vb, dv, acc, acc_stride, rows, first, layout, requests);
  }
};

// A bf16 or fp8 cache on a matrix unit: the sub-blocks, softmax and merge of
// partial_impl, with Q.K^T and P.V as multiplies of bf16 inputs and fp32
// accumulation. q is rounded to bf16 once per task (exact for a bf16 q: the
// scale comes after the multiply), each weight once per use, as FlashAttention
// does on tensor cores. Rows go in blocks of 16, padding rows zero. P.V visits
// keys in groups of 32 on a grid anchored at the sub-block's start, each row's
// weights zero outside its own keys: a row's sums run over the same groups in
// the same order alone, among other positions or in a shared chunk.
template <class Unit, typename T, int kD, int kDv>
void partial_bf16_unit(const PartialTask& t) {
  constexpr bool kBf16 = std::is_same_v<T, hwy::bfloat16_t>;
  using bf16::kPvKeys;
  using bf16::kTileRows;
  const CacheGeometry& g = *t.geometry;
  const int32_t rows = t.positions * t.heads;
  const int32_t blocks = (rows + kTileRows - 1) / kTileRows;
  const int64_t rows_pad = static_cast<int64_t>(blocks) * kTileRows;
  // Scratch: scores [rows_pad][kSubBlockTokens] | sub-block acc [rows_pad][kDv]
  // | then bf16: packed q [blocks][16 * kD] | short (or fp8) key runs [2][16][kD]
  // | packed V [32 * kDv] | packed P [16][32] | fp8 V rows [32][kDv]. Each
  // region is whole 64-byte lines.
  PhaseTimer clock(t.time_phases);
  float* scores = t.scratch;
  float* sub_acc = scores + rows_pad * kSubBlockTokens;
  auto* qb = reinterpret_cast<uint16_t*>(sub_acc + rows_pad * kDv);
  uint16_t* kpad = qb + rows_pad * kD;
  uint16_t* vb = kpad + 2 * kTileRows * kD;
  uint16_t* pa = vb + kPvKeys * kDv;
  uint16_t* v_bf16 = pa + kTileRows * kPvKeys;

  reset_states(t, kDv);
  const ReadPlan plan(t);
  if (plan.empty()) return;
  const PoolRows k_src(t.k_layer, t.blocks, g, t.kv_head, sizeof(T));
  const PoolRows v_src(t.v_layer, t.blocks, g, t.kv_head, sizeof(T));
  constexpr int64_t kLinesPerRow = std::max<int64_t>(1, kD * static_cast<int64_t>(sizeof(T)) / 64);
  LinePrefetch prefetch(plan, k_src, v_src, t.prefetch_ahead.unit_rows(rows) * kLinesPerRow,
                        Unit::prefetch_level(t.prefetch));
  for (int32_t b = 0; b < blocks; ++b) {
    const float* q[kTileRows];
    for (int32_t i = 0; i < kTileRows; ++i) {
      const int32_t r = b * kTileRows + i;
      q[i] = r < rows ? t.position[r / t.heads].q + static_cast<int64_t>(r % t.heads) * kD : nullptr;
    }
    bf16::pack_q(q, kD, qb + static_cast<int64_t>(b) * kTileRows * kD);
  }

  const typename Unit::Scope unit_state;
  SoftmaxStats<float> stats[kMaxTaskRows];
  const uint16_t* v_rows[kPvKeys];
  const uint8_t* v_codes[kPvKeys];  // fp8 V rows where the byte tables widen them
  const bool v_from_codes = !kBf16 && t.fp8_tables;
  // bf16 V for few rows on the dot products is read where it lies, interleaved
  // in registers (bf16dot::accumulate_in_place): no packed copy, and the sums
  // come out in lane order, put back in element order once per sub-block.
  // fp8 V codes likewise, widened in registers as they are used
  // (fp8tab::accumulate_in_place), in element order.
  const bool in_place_rows = Unit::kVInPlace && rows <= bf16dot::kInPlaceRows;
  const bool v_in_place = in_place_rows && kBf16;
  const bool codes_in_place = in_place_rows && v_from_codes;
  const float* p_rows[kTileRows];
  int32_t p_begin[kTileRows];
  int32_t p_end[kTileRows];
  int32_t key_begin[kMaxTaskRows];
  int32_t key_end[kMaxTaskRows];
  // Blocks of 9 to 16 rows on the dot products keep their scores and weights
  // key-major, the rows in the lanes (softmax_keys): no transpose of the sums,
  // and each pair of keys' weights one vector for P.V. Fewer rows put keys in
  // the lanes and their scores come out row-major.
  const auto key_major = [&](int32_t b) {
    return Unit::kKeyMajor && rows - b * kTileRows > kTileRows / 2;
  };
  int64_t weights_begin[kMaxTaskRows / kTileRows];  // keys softmax_keys wrote, per block
  int64_t weights_end[kMaxTaskRows / kTileRows];
  for (int64_t sb = plan.first_sub_block(); sb < plan.end_sub_block(); ++sb) {
    const int64_t base = t.chunk_begin + sb * kSubBlockTokens;  // scores index = position - base
    const ReadPlan::Span span = plan.sub_block(sb);
    clock.mark(KernelPhase::kOther);

    // Pass 1: two groups of 16 keys at a time, each read in place where its
    // run has 16, else copied beside zero rows (the second group only after a
    // whole first one: its scores land 16 positions on). fp8 keys are widened
    // into a copy: for up to 8 rows on the dot products, pair by pair through
    // the byte tables (fp8tab::pack_k), which spares the keys-in-lanes form
    // its per-key inserts and spreads (AMD Zen 5, 2 threads, e4m3, 8 x 4096
    // tokens: GQA 4 0.92-0.96x the time, GQA 8 0.94x); 16 rows keep rows in
    // the lanes, level either way; else as rows.
    const bool packed_keys = Unit::kPackedKeys && (kBf16 || t.fp8_tables) && rows <= 8;
    for (int64_t pos = span.begin; pos < span.end;) {
      bf16::KeyRows groups[2];
      int32_t count = 0;
      int64_t at = pos;
      while (count < 2 && at < span.end && (count == 0 || groups[0].n == kTileRows)) {
        int64_t n = 0;
        const auto* run = reinterpret_cast<const T*>(k_src.run(at, span.end, &n));
        n = std::min<int64_t>(n, kTileRows);
        const uint16_t* k = reinterpret_cast<const uint16_t*>(run);
        uint16_t* pad = kpad + count * kTileRows * kD;
        if (packed_keys) {
          if constexpr (kBf16) {
            bf16::pack_k(k, kD * static_cast<int64_t>(sizeof(uint16_t)), static_cast<int32_t>(n), kD, pad);
          } else {
            fp8tab::pack_k(kFp8Format<T>, reinterpret_cast<const uint8_t*>(run), kD, static_cast<int32_t>(n), kD,
                           pad);
          }
          k = pad;
        } else if (n < kTileRows || !kBf16) {
          if constexpr (kBf16) {
            std::memcpy(pad, run, static_cast<size_t>(n * kD) * sizeof(uint16_t));
          } else {
            rows_to_bf16<T, kD, kD>(run, n, pad, t.fp8_tables);
          }
          std::fill(pad + n * kD, pad + kTileRows * kD, uint16_t{0});
          k = pad;
        }
        groups[count++] = {k, kD * static_cast<int64_t>(sizeof(uint16_t)), static_cast<int32_t>(n)};
        at += n;
      }
      // The first block requests this stretch's worth of lines as it goes.
      prefetch.consumed((at - pos) * kLinesPerRow);
      for (int32_t b = 0; b < blocks; ++b) {
        const bf16::Requests requests{&prefetch, b == 0 ? (at - pos) * kLinesPerRow : 0};
        const uint16_t* q_block = qb + static_cast<int64_t>(b) * kTileRows * kD;
        const int32_t live = std::min(kTileRows, rows - b * kTileRows);
        float* out = scores + static_cast<int64_t>(b) * kTileRows * kSubBlockTokens + (pos - base);
        if constexpr (Unit::kKeyMajor) {
          if (key_major(b)) {
            // Two key-major blocks at once where there are two: each key's
            // words then serve both.
            const auto key_major_out = [&](int32_t block) {
              return scores + static_cast<int64_t>(block) * kTileRows * kSubBlockTokens + kTileRows * (pos - base);
            };
            const bool pair = b + 1 < blocks && key_major(b + 1);
            Unit::scores_by_key(q_block, kD, groups, count, t.score_scale, key_major_out(b), requests,
                                pair ? q_block + kTileRows * kD : nullptr, pair ? key_major_out(b + 1) : nullptr);
            if (pair) ++b;
            continue;
          }
        }
        if constexpr (Unit::kPackedKeys) {
          if (packed_keys) {
            Unit::scores_packed(q_block, kD, groups, count, live, t.score_scale, out, kSubBlockTokens, requests);
            continue;
          }
        }
        Unit::scores(q_block, kD, groups, count, live, t.score_scale, out, kSubBlockTokens, requests);
      }
      prefetch.catch_up();
      pos = at;
    }
    clock.mark(KernelPhase::kScores);
    // Each row's keys relative to the sub-block (none: an empty range), once
    // for the softmax and all of P.V's groups (bf16, 16 rows, GQA 4 with four
    // query rows: 0.96x the time, one thread, cache-resident).
    for (int32_t r = 0; r < rows; ++r) {
      const ReadPlan::Span keys = plan.keys_of(r / t.heads, sb);
      key_begin[r] = static_cast<int32_t>(keys.begin - base);
      key_end[r] = static_cast<int32_t>(keys.end - base);
    }
    for (int32_t b = 0; b < blocks; ++b) {
      const int32_t live = std::min(kTileRows, rows - b * kTileRows);
      if (key_major(b)) {
        softmax_keys(scores + static_cast<int64_t>(b) * kTileRows * kSubBlockTokens, key_begin + b * kTileRows,
                     key_end + b * kTileRows, live, t.soft_cap, stats + b * kTileRows, &weights_begin[b],
                     &weights_end[b]);
        continue;
      }
      for (int32_t r = b * kTileRows; r < b * kTileRows + live; ++r) {
        stats[r] = softmax_row(scores + static_cast<int64_t>(r) * kSubBlockTokens, key_begin[r], key_end[r],
                               t.soft_cap);
      }
    }
    for (int32_t r = 0; r < rows; ++r) {
      if (stats[r].m == neg_inf<float>()) key_begin[r] = key_end[r] = 0;
    }
    clock.mark(KernelPhase::kSoftmax);

    // Pass 2: P.V, 32 keys at a time, V interleaved once for every row block.
    // A block's first group with a weight writes its tiles from zero; a row
    // with keys has them in some group, so its sums start there.
    bool started[kMaxTaskRows / kTileRows] = {};
    // Block b's weights over the group at g0 into pa; false where all are zero
    // (the sums would not change).
    const auto pack_weights = [&](int32_t b, int32_t live, int64_t g0) {
      bool any = false;
      for (int32_t i = 0; i < live; ++i) {
        const int32_t r = b * kTileRows + i;
        const int32_t at = static_cast<int32_t>(g0);
        p_begin[i] = std::clamp(key_begin[r] - at, 0, kPvKeys);
        p_end[i] = std::clamp(key_end[r] - at, 0, kPvKeys);
        p_rows[i] = scores + static_cast<int64_t>(r) * kSubBlockTokens + g0;
        any = any || p_begin[i] < p_end[i];
      }
      if (!any) return false;
      if (key_major(b)) {  // pairs of the group inside the weights softmax_keys wrote
        const int64_t first = std::clamp<int64_t>(weights_begin[b] - g0, 0, kPvKeys) / 2;
        const int64_t end = std::clamp<int64_t>(weights_end[b] - g0, 0, kPvKeys) / 2;
        bf16::pack_p_pairs(scores + static_cast<int64_t>(b) * kTileRows * kSubBlockTokens + kTileRows * g0,
                           static_cast<int32_t>(first), static_cast<int32_t>(end), pa);
      } else {
        bf16::pack_p(p_rows, p_begin, p_end, live, pa);
      }
      return true;
    };
    for (int64_t g0 = (span.begin - base) / kPvKeys * kPvKeys; base + g0 < span.end; g0 += kPvKeys) {
      const int64_t lo = std::max(span.begin, base + g0);
      const int64_t hi = std::min(span.end, base + g0 + kPvKeys);
      if (v_from_codes) {
        std::fill(v_codes, v_codes + kPvKeys, nullptr);
      } else {
        std::fill(v_rows, v_rows + kPvKeys, nullptr);
      }
      for (int64_t pos = lo; pos < hi;) {
        int64_t n = 0;
        const auto* v = reinterpret_cast<const T*>(v_src.run(pos, hi, &n));
        const int64_t first = pos - base - g0;
        if constexpr (kBf16) {
          for (int64_t j = 0; j < n; ++j) v_rows[first + j] = reinterpret_cast<const uint16_t*>(v + j * kD);
        } else if (v_from_codes) {
          for (int64_t j = 0; j < n; ++j) v_codes[first + j] = reinterpret_cast<const uint8_t*>(v + j * kD);
        } else {
          rows_to_bf16<T, kDv, kD>(v, n, v_bf16 + first * kDv, t.fp8_tables);
          for (int64_t j = 0; j < n; ++j) v_rows[first + j] = v_bf16 + (first + j) * kDv;
        }
        pos += n;
      }
      prefetch.consumed((hi - lo) * kLinesPerRow);
      const bf16::Requests v_requests{&prefetch, (hi - lo) * kLinesPerRow};
      if (v_in_place || codes_in_place) {  // one block, V read where it lies
        if (pack_weights(0, rows, g0)) {
          if (codes_in_place) {
            fp8tab::accumulate_in_place(kFp8Format<T>, pa, v_codes, kDv, sub_acc, kDv, rows, !started[0], v_requests);
          } else {
            bf16dot::accumulate_in_place(pa, v_rows, kDv, sub_acc, kDv, rows, !started[0], v_requests);
          }
          started[0] = true;
        }
        prefetch.catch_up();
        continue;
      }
      // The group's line requests go out half over its packing and, where
      // the unit spreads them, half over its multiplies: all inside the
      // packing, they went out as one burst while the multiplies requested
      // nothing (AMD Zen 5, 8 x 4096 tokens, 2 threads, medians of 7 paired
      // runs: bf16 GQA 4 with four query rows 0.93x the time, GQA 8 0.95x
      // with one and with four, e4m3 GQA 8 with four 0.95x; cache-resident,
      // level).
      const int64_t in_pack = Unit::kPvSpreadsRequests ? v_requests.lines / 2 : v_requests.lines;
      const bf16::Requests pack_requests{&prefetch, in_pack};
      bf16::Requests acc_requests{&prefetch, v_requests.lines - in_pack};  // the first block's multiplies
      if (v_from_codes) {
        fp8tab::pack_v(kFp8Format<T>, v_codes, kDv, vb, pack_requests);  // widened and interleaved in one pass
      } else {
        bf16::pack_v(v_rows, kDv, vb, pack_requests);
      }
      for (int32_t b = 0; b < blocks; ++b) {
        const int32_t live = std::min(kTileRows, rows - b * kTileRows);
        if (!pack_weights(b, live, g0)) continue;
        Unit::accumulate(pa, vb, kDv, sub_acc + static_cast<int64_t>(b) * kTileRows * kDv, kDv, live, !started[b],
                         key_major(b) ? bf16::PLayout::kPairMajor : bf16::PLayout::kRowMajor, acc_requests);
        acc_requests = {};
        started[b] = true;
      }
      prefetch.catch_up();
    }
    if (v_in_place && started[0]) bf16dot::lanes_to_elements(sub_acc, kDv, rows, kDv);
    clock.mark(KernelPhase::kValues);
    merge_sub_block(t, stats, sub_acc, kDv);
    clock.mark(KernelPhase::kMerge);
  }
}

template <class Unit, int kD, int kDv>
void partial_for_unit(const PartialTask& t) {
  switch (t.geometry->dtype) {
    case DType::kBFloat16: return partial_bf16_unit<Unit, hwy::bfloat16_t, kD, kDv>(t);
    case DType::kFloat8E4M3: return partial_bf16_unit<Unit, Fp8E4M3Bits, kD, kDv>(t);
    case DType::kFloat8E5M2: return partial_bf16_unit<Unit, Fp8E5M2Bits, kD, kDv>(t);
    case DType::kFloat32:
    case DType::kFloat16: break;  // never on a matrix unit (matrix_unit_for)
  }
  HWY_ABORT("the matrix-unit path reached a cache of dtype %d", static_cast<int>(t.geometry->dtype));
}
#endif

// V's width is the one vocabulary.h pairs with kD.
template <int kD>
void partial_for_dtype(const PartialTask& t) {
  constexpr int kDv = v_head_dim_for(kD);
  if (t.unit != MatrixUnit::kNone) {
    // Set only where the dispatched target is AVX3 (matrix_unit_for).
#if HWY_TARGET == HWY_AVX3
    if (t.unit == MatrixUnit::kAmx) return partial_for_unit<AmxUnit, kD, kDv>(t);
    return partial_for_unit<DotUnit, kD, kDv>(t);
#else
    HWY_ABORT("the matrix-unit path reached target %s", hwy::TargetName(HWY_TARGET));
#endif
  }
  switch (t.geometry->dtype) {
    case DType::kFloat32: return partial_impl<float, kD, kDv>(t);
    case DType::kFloat16: return partial_impl<hwy::float16_t, kD, kDv>(t);
    case DType::kBFloat16: return partial_impl<hwy::bfloat16_t, kD, kDv>(t);
    case DType::kFloat8E4M3: return partial_impl<Fp8E4M3Bits, kD, kDv>(t);
    case DType::kFloat8E5M2: return partial_impl<Fp8E5M2Bits, kD, kDv>(t);
  }
}

// One instance per head dim of the vocabulary; the geometry was validated
// (geometry_rules.h), so the fallback is unreachable.
void ComputePartial(const PartialTask& t) {
  dispatch_head_dim(
      t.geometry->head_dim, [&](auto d) { partial_for_dtype<decltype(d)::value>(t); },
      [&] { HWY_ABORT("head_dim %d reached the CPU kernel unvalidated", t.geometry->head_dim); });
}

// The softmax's weights 2^x of n values x <= 0 on this target, whole vectors
// and then a tail through a zero-padded one.
void SoftmaxExp2(const float* HWY_RESTRICT x, float* HWY_RESTRICT out, int64_t n) {
  const DF df;
  const int64_t lanes = static_cast<int64_t>(hn::Lanes(df));
  int64_t i = 0;
  for (; i + lanes <= n; i += lanes) hn::StoreU(exp2_nonpositive(hn::LoadU(df, x + i)), df, out + i);
  if (i == n) return;
  alignas(64) float tail[HWY_MAX_BYTES / sizeof(float)] = {};
  std::copy(x + i, x + n, tail);
  hn::Store(exp2_nonpositive(hn::Load(df, tail)), df, tail);
  std::copy(tail, tail + (n - i), out + i);
}

// Independent FMA chains in registers, enough to cover the FMA latency on two
// ports (4 cycles x 2), over a loop long enough to time.
double FmaPeakOneThread() {
  const DF df;
  constexpr int kChains = 12;
  constexpr int64_t kIters = 1 << 22;
  VF a[kChains];
  for (int i = 0; i < kChains; ++i) a[i] = hn::Set(df, 1.f + 1e-7f * static_cast<float>(i));
  const VF m = hn::Set(df, 0.999999f);
  const VF c = hn::Set(df, 1e-7f);
  const auto t0 = std::chrono::steady_clock::now();
  for (int64_t it = 0; it < kIters; ++it) {
    for (int i = 0; i < kChains; ++i) a[i] = hn::MulAdd(a[i], m, c);
  }
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  VF sum = a[0];
  for (int i = 1; i < kChains; ++i) sum = hn::Add(sum, a[i]);
  volatile float sink = hn::GetLane(sum);
  (void)sink;
  return 2.0 * static_cast<double>(hn::Lanes(df)) * kChains * static_cast<double>(kIters) / s;
}

const char* TargetName() { return hwy::TargetName(HWY_TARGET); }

}  // namespace pagoda::cpu::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace pagoda::cpu {

HWY_EXPORT(ComputePartial);
HWY_EXPORT(FmaPeakOneThread);
HWY_EXPORT(SoftmaxExp2);
HWY_EXPORT(TargetName);

void compute_partial(const PartialTask& task) { HWY_DYNAMIC_DISPATCH(ComputePartial)(task); }
const char* simd_target_name() { return HWY_DYNAMIC_DISPATCH(TargetName)(); }
double fma_peak_one_thread() { return HWY_DYNAMIC_DISPATCH(FmaPeakOneThread)(); }
void softmax_exp2(const float* x, float* out, int64_t n) { HWY_DYNAMIC_DISPATCH(SoftmaxExp2)(x, out, n); }

}  // namespace pagoda::cpu
#endif
