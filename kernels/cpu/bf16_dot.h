#pragma once
// AVX512-BF16 dot products (VDPBF16PS: Cooper Lake, Zen 4 and later) for the
// CPU kernel's bf16 caches (and fp8 ones, widened to bf16 exactly) where there
// are no AMX tiles: the same Q.K^T and P.V of bf16 inputs with fp32
// accumulation, on the operands bf16_blocks.h packs, in vector registers.
// On Zen 4 a 512-bit VDPBF16PS (32 multiply-adds) issues as often as a
// 512-bit FMA (16): measured 226 against 113 GFLOP/s on one thread.
//
// Lanes. Scores of 9 to 16 rows put the rows in the lanes: pair p of q for 16
// rows is one vector of the packed q, each key's pair p a 32-bit broadcast
// from the cache row where it lies, so K is neither converted nor rearranged
// and there is no horizontal sum. Up to 8 rows put keys in the lanes too: 16
// keys, each key's pair p packed in its word (bf16::pack_k, or for fp8
// fp8tab::pack_k, which widens as it packs), against a row's q pair
// broadcast; or, where fp8 has no byte tables, a 128-bit lane per key, a quad
// of rows in its words, the key's pairs inserted from its row and spread over
// the lane one at a time. P.V puts 16 output elements in the lanes: a vector
// of packed V (two keys x 16 elements) against a row's two weights broadcast.
//
// Bits: every output element is one chain over its reduced dimension, pair
// after pair in order, whatever the other rows, keys or lanes hold, so a row
// computed among 16 has the bits it has alone. Zero weights add exact zeros.
// Products of bf16 values are exact in fp32; each pair's sum is rounded to
// nearest even, subnormal inputs and results flushed to zero (as AMX does).

#include <cstdint>

#include "cpu/bf16_blocks.h"

namespace pagoda::cpu::bf16dot {

using bf16::KeyRows;
using bf16::Requests;

// Whether this CPU has AVX512-BF16 (with AVX-512 F, BW, VL, DQ). Asked once.
bool available();

// out[r * out_stride + 16 g + j] = scale * (q[r] . keys[g][j]) for r < rows (at
// most 16), g < groups (1 or 2) and j < keys[g].n, q packed by bf16::pack_q.
void scores(const uint16_t* qb, int32_t d, const KeyRows* keys, int32_t groups, int32_t rows, float scale, float* out,
            int64_t out_stride, Requests requests = {});

// The same scores, the same bits, from keys packed pair by pair
// (fp8tab::pack_k): keys[g].k is group g's packed block (its stride unread),
// of which the first keys[g].n keys are scored.
void scores_packed(const uint16_t* qb, int32_t d, const KeyRows* keys, int32_t groups, int32_t rows, float scale,
                   float* out, int64_t out_stride, Requests requests = {});

// The scores of all 16 rows of packed q, key-major: out[16 (16 g + j) + r] =
// scale * (q[r] . keys[g][j]) for j < keys[g].n (the bits scores() gives),
// with no transpose: the rows are the lanes of the sums. With qb2, a second
// block of 16 rows scores the same keys into out2 alike, each key's words
// loaded once for both.
void scores_by_key(const uint16_t* qb, int32_t d, const KeyRows* keys, int32_t groups, float scale, float* out,
                   Requests requests = {}, const uint16_t* qb2 = nullptr, float* out2 = nullptr);

// acc[r * acc_stride + e] += sum over j of pa[r][j] * v[j][e] for r < rows (at
// most 16) and e < dv, pa packed by bf16::pack_p (kRowMajor) or
// bf16::pack_p_pairs (kPairMajor) and V by bf16::pack_v; with `first`, acc is
// not read (= instead of +=). `requests` go out spread over the multiplies.
void accumulate(const uint16_t* pa, const uint16_t* vb, int32_t dv, float* acc, int64_t acc_stride, int32_t rows,
                bool first = false, bf16::PLayout layout = bf16::PLayout::kRowMajor, Requests requests = {});

// The same sums for up to kInPlaceRows rows from V rows where they lie (v[j]:
// row j of the 32 keys, dv bf16 values; null: a zero row), without
// bf16::pack_v: each pair of rows is interleaved in registers as it is used,
// and acc comes out in lane order: elements 32c .. 32c + 31 of a row sit at
// acc + 32c as lanes_to_elements describes. The bits of every element are
// accumulate's. Up to 4 rows (a GQA-4 group with one query row) it beats
// packing V, which costs more than the few rows' multiplies: AMD Zen 5, one
// thread, bf16, cache-resident, 0.94x the time; 8 rows were level and 16
// 1.06x slower (each V vector then feeds enough rows to pay for its packing).
inline constexpr int32_t kInPlaceRows = 4;
void accumulate_in_place(const uint16_t* pa, const uint16_t* const* v, int32_t dv, float* acc, int64_t acc_stride,
                         int32_t rows, bool first, Requests requests = {});

// Rows of accumulate_in_place's lane order put in element order, in place.
// In lane order, 32 elements c .. c + 31 are two vectors, the low and high
// halves of interleaving two rows' words inside 128-bit lanes: lane i of the
// first holds element c + 8 (i / 4) + i % 4, of the second c + 8 (i / 4) + 4 + i % 4.
void lanes_to_elements(float* acc, int64_t acc_stride, int32_t rows, int32_t dv);

// VDPBF16PS throughput of one thread, FLOP/s (2 per multiply-add), from a loop
// of independent 512-bit chains: the compute roof of the bf16 rows on this unit.
double peak_one_thread();

}  // namespace pagoda::cpu::bf16dot
