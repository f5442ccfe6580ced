// How the CPU kernel reads the cache's elements: fp8, fp16 and bf16 widened to
// fp32 in registers (bf16 in its paired order), e4m3's NaN code found before a
// run is read in place, and the shapes a call's rows come in (one run, row
// pointers, a list of runs).
//
// Part of the CPU kernel's per-target code: decode_cpu.cc includes it after
// Highway's foreach_target, once per SIMD target (hence the toggled guard).

#include <cstdint>
#include <type_traits>

#include <hwy/highway.h>

#include "cpu/decode_blocking_inl.h"
#include "cpu/decode_cpu.h"
#include "cpu/decode_tiles.h"
#include "cpu/fp8_tables.h"
#include "pagoda/vocabulary.h"

#if defined(PAGODA_CPU_DECODE_READS_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef PAGODA_CPU_DECODE_READS_INL_H_
#undef PAGODA_CPU_DECODE_READS_INL_H_
#else
#define PAGODA_CPU_DECODE_READS_INL_H_
#endif

HWY_BEFORE_NAMESPACE();
namespace pagoda::cpu::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// The fp8 cache formats, and the codes' types: a format, or e4m3 rows known
// to hold no NaN code.
template <typename T>
constexpr bool kIsFp8 = std::is_same_v<T, Fp8E4M3Bits> || std::is_same_v<T, Fp8E5M2Bits>;
template <typename T>
constexpr bool kIsFp8Bits = kIsFp8<T> || std::is_same_v<T, Fp8E4M3FiniteBits>;

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

}  // namespace pagoda::cpu::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#endif  // PAGODA_CPU_DECODE_READS_INL_H_
