// The CPU kernel's vector types and register blocking: how many rows and
// tokens (scores) or vectors (P.V) one step holds on each target, and which
// rows read the cache in place.
//
// Part of the CPU kernel's per-target code: decode_cpu.cc includes it after
// Highway's foreach_target, once per SIMD target (hence the toggled guard).


#include <hwy/highway.h>


#if defined(PAGODA_CPU_DECODE_BLOCKING_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef PAGODA_CPU_DECODE_BLOCKING_INL_H_
#undef PAGODA_CPU_DECODE_BLOCKING_INL_H_
#else
#define PAGODA_CPU_DECODE_BLOCKING_INL_H_
#endif

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

}  // namespace pagoda::cpu::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#endif  // PAGODA_CPU_DECODE_BLOCKING_INL_H_
