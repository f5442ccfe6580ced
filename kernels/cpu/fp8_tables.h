#pragma once
// fp8 cache rows widened through byte tables (AVX-512 VBMI: Ice Lake, Zen 4
// and later) instead of integer arithmetic on each element.
//
// Every fp8 value is exact in bf16, so a code's widened value is 16 bits
// (the top half of its fp32 bits; the bottom half is zero). VPERMI2B looks up
// 64 codes at a time in a 128-entry byte table held in two registers, indexed
// by the code's low 7 bits (the magnitude): one lookup gives the low bytes,
// one the high bytes, and the code's sign bit is OR-ed into the high byte.
// Byte and word interleaves then place each value in the top half of an fp32
// lane (or side by side as bf16). About 10 instructions per 64 codes, where
// the arithmetic widening of e4m3 costs 7 per 16. For the AVX512-BF16 dot
// products the codes are arranged first, so that the widened words land in
// the packed operands themselves (pack_k, pack_v).
//
// Values: exactly those of load_f32 (decode_reads_inl.h), NaN payloads included:
// the tables are built from the same fp16 bit patterns and the same hardware
// fp16 -> fp32 conversion, so a kernel reads the same bits either way. e4m3
// reads 2^-8 of its value, as everywhere on the CPU (fp8_read_factor).

#include <cstdint>

#include "cpu/bf16_blocks.h"
#include "pagoda/dtype.h"

namespace pagoda::cpu::fp8tab {

// Whether this CPU has AVX-512 VBMI (with F and BW). Asked once.
bool available();

// The fp32 value (bits) row widening gives `code` of `format`: the table's
// entry. Requires available() (the tables are built with F16C's conversion).
uint32_t widened_bits(DType format, uint8_t code);

// n rows of `width` codes (a multiple of 64), the first `stride` bytes apart,
// as fp32 into out ([n][width]). Requires available().
void rows_to_f32(DType format, const uint8_t* in, int64_t stride, int64_t n, int32_t width, float* out);

// The same as bf16 bits into out ([n][width]): exact, the top halves of
// rows_to_f32's values.
void rows_to_bf16(DType format, const uint8_t* in, int64_t stride, int64_t n, int32_t width, uint16_t* out);

// Up to 16 key rows of codes (`stride` bytes apart, the first n read, the
// others zero) widened and arranged pair by pair for bf16dot::scores_packed:
// kb[p][j][i] = bf16(k[j][2p + i]), pair p of the 16 keys the 64 bytes at
// kb + 32p, the values rows_to_bf16 gives. d is a multiple of 64; kb holds
// 16 d values. Requires available().
void pack_k(DType format, const uint8_t* k, int64_t stride, int32_t n, int32_t d, uint16_t* kb);

// 32 V rows of codes (v[j] null: a zero row) widened and interleaved in one
// pass into bf16::pack_v's layout: vb[t][k][e][i] = bf16(v[2k + i][16t + e]),
// the values rows_to_bf16 gives. dv is a multiple of 64. Requires available().
void pack_v(DType format, const uint8_t* const* v, int32_t dv, uint16_t* vb, bf16::Requests requests = {});

// P.V of up to 4 rows straight from V's codes, on the AVX512-BF16 dot
// products: acc[r * acc_stride + e] += sum over j of pa[r][j] * v[j][e] (=
// with `first`), the bits of pack_v then bf16dot::accumulate, in element
// order. Each pair of rows is widened into pack_v's vectors in registers and
// used at once, so the widening's shuffles and the multiplies interleave
// instead of running one after the other. dv is a multiple of 64. Requires
// available() and AVX512-BF16.
void accumulate_in_place(DType format, const uint16_t* pa, const uint8_t* const* v, int32_t dv, float* acc,
                         int64_t acc_stride, int32_t rows, bool first, bf16::Requests requests = {});

}  // namespace pagoda::cpu::fp8tab
