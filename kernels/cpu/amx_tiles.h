#pragma once
// Intel AMX (Advanced Matrix Extensions, Sapphire Rapids and later) for the
// CPU kernel's bf16 caches (and fp8 ones, widened to bf16 exactly): Q.K^T and P.V as tile multiplies of bf16 inputs
// with fp32 accumulation (TDPBF16PS), the softmax around them staying in
// AVX-512 (decode_units_inl.h). Plain functions with target attributes, called only
// after available() said yes; no Highway here.
//
// Layouts. A tile is 16 rows of 64 bytes. TDPBF16PS C[m][n] += sum over k of
// A[m][2k] B[k][2n] + A[m][2k+1] B[k][2n+1]: B holds pairs of the reduced
// dimension side by side ("VNNI" order). Scores are computed transposed,
// S^T = K . Q^T, so that A is 16 cache rows read where they lie and only q
// (once per task) and each 16 x 16 block of scores (once per 16 keys) are
// rearranged; P.V is O += P . V with V's rows interleaved in pairs once per
// 32 keys, shared by every row block.
//
// Bits: every element of C is its own chain over the reduced dimension in a
// fixed order, whatever the other rows or columns of the tiles hold, so a row
// computed in a block of 16 has the bits it has alone. Zero weights (keys out
// of a row's range, padding) add exact zeros.

#include <cstdint>

#include "cpu/bf16_blocks.h"

namespace pagoda::cpu::amx {

// The operands are packed as bf16_blocks.h lays them out.
using bf16::KeyRows;
using bf16::kPvKeys;
using bf16::kTileRows;
using bf16::pack_p;
using bf16::pack_q;
using bf16::pack_v;
using bf16::Requests;

// Whether this CPU has AMX-TILE, AMX-BF16 and AVX512-BF16 and the kernel lets
// this process use the tile data (arch_prctl ARCH_REQ_XCOMP_PERM). Asked once.
bool available();

// Loads the tile configuration on the calling thread for the functions below
// and releases the tiles at scope end (the tile state is per thread and costs
// 8 KiB per context switch while live).
class TileScope {
 public:
  TileScope();
  ~TileScope();
  TileScope(const TileScope&) = delete;
  TileScope& operator=(const TileScope&) = delete;
};

// out[r * out_stride + 16 g + j] = scale * (q[r] . keys[g][j]) for r < rows, g
// < groups (1 or 2) and j < keys[g].n, q packed by pack_q.
void scores(const uint16_t* qb, int32_t d, const KeyRows* keys, int32_t groups, int32_t rows, float scale, float* out,
            int64_t out_stride, Requests requests = {});

// acc[r * acc_stride + e] += sum over j of pa[r][j] * v[j][e], for all 16 rows
// (each readable and writable) and e < dv; with `first`, acc is not read (=
// instead of +=: the first group of a sub-block starts from zero tiles).
void accumulate(const uint16_t* pa, const uint16_t* vb, int32_t dv, float* acc, int64_t acc_stride,
                bool first = false);

// TDPBF16PS throughput of one thread, FLOP/s (2 per multiply-add), from a loop
// of independent tile multiplies: the matrix roof of the bf16 rows.
double peak_one_thread();

}  // namespace pagoda::cpu::amx
