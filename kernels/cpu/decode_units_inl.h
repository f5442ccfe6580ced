// The matrix units' path (AVX-512 only): Q.K^T and P.V of bf16 operands on
// AMX tiles or AVX512-BF16 dot products, the softmax and merge on the FMAs.
//
// Part of the CPU kernel's per-target code: decode_cpu.cc includes it after
// Highway's foreach_target, once per SIMD target (hence the toggled guard).

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include <hwy/highway.h>

#include "cpu/amx_tiles.h"
#include "cpu/bf16_blocks.h"
#include "cpu/bf16_dot.h"
#include "cpu/decode_blocking_inl.h"
#include "cpu/decode_cpu.h"
#include "cpu/decode_reads_inl.h"
#include "cpu/decode_softmax_inl.h"
#include "cpu/decode_states_inl.h"
#include "cpu/decode_stretches_inl.h"
#include "cpu/decode_tiles.h"
#include "cpu/fp8_tables.h"
#include "cpu/phase_clock.h"
#include "pagoda/softmax_state.h"
#include "pagoda/vocabulary.h"

#if defined(PAGODA_CPU_DECODE_UNITS_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef PAGODA_CPU_DECODE_UNITS_INL_H_
#undef PAGODA_CPU_DECODE_UNITS_INL_H_
#else
#define PAGODA_CPU_DECODE_UNITS_INL_H_
#endif

HWY_BEFORE_NAMESPACE();
namespace pagoda::cpu::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

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

}  // namespace pagoda::cpu::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#endif  // PAGODA_CPU_DECODE_UNITS_INL_H_
