#pragma once
// The bf16 operand layouts of the CPU kernel's matrix-unit paths: AMX tiles
// (amx_tiles.h) and AVX512-BF16 dot products (bf16_dot.h) read the same packed
// q, V and P, so the kernel (decode_units_inl.h) packs them once whichever unit
// multiplies. Plain functions with target attributes (AVX512-BF16 and the
// AVX-512 subsets), called only after one unit's available() said yes.
//
// VDPBF16PS and TDPBF16PS both reduce pairs: C[n] += A[2k] B[2k] + A[2k+1]
// B[2k+1], so the reduced dimension sits in pairs side by side ("VNNI"
// order) in the operand whose lanes are the output's.

#include <cstdint>

namespace pagoda::cpu {
class LinePrefetch;
}

namespace pagoda::cpu::bf16 {

// Cache lines to request while a function of a unit runs, spread over its
// steps: the multiplies are short, and requests issued in one burst before them
// would leave the memory idle while they run.
struct Requests {
  LinePrefetch* prefetch = nullptr;
  int64_t lines = 0;
};

// Rows of a block: query rows per block, keys per score step.
inline constexpr int kTileRows = 16;
// Keys per P.V step: 16 pairs.
inline constexpr int kPvKeys = 32;
// bf16 values of one 16 x 64-byte block (an AMX tile).
inline constexpr int kValuesPerTile = kTileRows * 32;

// Up to 16 key rows where they lie: d bf16 values each, `stride` bytes
// apart, all 16 readable and finite (a short run is copied beside zero rows);
// the first n are scored.
struct KeyRows {
  const uint16_t* k;
  int64_t stride;
  int32_t n;
};

// Whether this CPU has AVX512-BF16 with AVX-512 F, BW, VL and DQ (the packing
// below, and the dot-product unit).
bool cpu_has_avx512_bf16();

// q of up to 16 rows (q[r] null past the rows: zero), pair by pair:
// qb[c][k][r][i] = bf16(q[r][32c + 2k + i]), rounded to nearest even, so pair
// p of all 16 rows is the 64 bytes at qb + 32p (an AMX B tile per 32 elements
// of d). d is a multiple of 32; qb holds 16 * d values.
void pack_q(const float* const* q, int32_t d, uint16_t* qb);

// Up to 16 bf16 key rows (`stride` bytes apart, the first n read, the others
// zero) pair by pair, for bf16dot::scores_packed: kb[p][j][i] = k[j][2p + i],
// pair p of the 16 keys the 64 bytes at kb + 32p (fp8tab::pack_k's layout).
// d is a multiple of 32; kb holds 16 d values.
void pack_k(const uint16_t* k, int64_t stride, int32_t n, int32_t d, uint16_t* kb);

// 32 V rows (v[j] null: a zero row), interleaved in pairs of keys per 16
// output elements: vb[t][k][e][i] = v[2k + i][16t + e]. dv is a multiple of 32;
// vb holds 32 * dv values.
void pack_v(const uint16_t* const* v, int32_t dv, uint16_t* vb, Requests requests = {});

// 16 rows' weights over 32 keys, row-major: pa[r][j] = bf16(p[r][j]) for j in
// [begin[r], end[r]), else 0; rows from `rows` on are zero. Reads p[r][0..32)
// only where the range covers it.
void pack_p(const float* const* p, const int32_t* begin, const int32_t* end, int32_t rows, uint16_t* pa);

// The same 16 rows' weights over 32 keys from key-major weights (p[16 j + r]:
// key j, row r, zero where row r does not attend key j), pair-major:
// pa[k][r][i] = bf16(p[16 (2k + i) + r]) for pairs k in [first_pair,
// end_pair), else 0 (p is read only there). A pair of weights for 16 rows is
// then one vector, for P.V's broadcasts to read as a row-major pa's.
void pack_p_pairs(const float* p, int32_t first_pair, int32_t end_pair, uint16_t* pa);

// Which of the two layouts above a packed P is in.
enum class PLayout { kRowMajor, kPairMajor };

}  // namespace pagoda::cpu::bf16
