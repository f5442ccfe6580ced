// fp8 rows widened through VBMI byte tables (fp8_tables.h).
#include "cpu/fp8_tables.h"

#include <cpuid.h>
#include <immintrin.h>

#include <bit>
#include <cstring>

#include "cpu/bf16_blocks_inl.h"

// GCC 12's AVX-512 intrinsics start their results from _mm512_undefined_*(),
// which -Wuninitialized reports once inlined (GCC bug 105593, fixed in 13).
#if defined(__GNUC__) && !defined(__clang__) && __GNUC__ < 13
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif

#define PAGODA_VBMI_TARGET __attribute__((target("avx512f,avx512bw,avx512vbmi,f16c")))
// The same with AVX512-BF16, for P.V straight from the codes.
#define PAGODA_VBMI_BF16_TARGET __attribute__((target("avx512f,avx512bw,avx512vbmi,avx512bf16,f16c")))

namespace pagoda::cpu::fp8tab {
namespace {

// The fp16 bit pattern load_f32 builds from a code (decode_reads_inl.h): e5m2 is
// the top byte of an fp16; e4m3's byte sign-extended, shifted left by 7, bit
// 14 cleared (2^-8 of its value), and the NaN code given the all-ones exponent.
uint16_t fp16_pattern(DType format, uint8_t code) {
  if (format == DType::kFloat8E5M2) return static_cast<uint16_t>(code << 8);
  const auto wide = static_cast<uint16_t>(static_cast<int16_t>(static_cast<int8_t>(code)) * 128);
  auto h = static_cast<uint16_t>(wide & 0xBFFF);
  if ((h & 0x7FFF) == 0x3F80) h = static_cast<uint16_t>(h | 0x7C00);
  return h;
}

PAGODA_VBMI_TARGET uint32_t fp32_bits_of_fp16(uint16_t h) {
  return std::bit_cast<uint32_t>(_cvtsh_ss(h));  // VCVTPH2PS, as load_f32's PromoteTo
}

// Low and high bytes of the bf16 value of each magnitude 0..127.
struct Tables {
  alignas(64) uint8_t lo[128];
  alignas(64) uint8_t hi[128];
};

struct FormatTables {
  Tables e4m3;
  Tables e5m2;

  FormatTables() {
    fill(DType::kFloat8E4M3, e4m3);
    fill(DType::kFloat8E5M2, e5m2);
  }
  static void fill(DType format, Tables& t) {
    for (int m = 0; m < 128; ++m) {
      const uint32_t bits = fp32_bits_of_fp16(fp16_pattern(format, static_cast<uint8_t>(m)));
      t.lo[m] = static_cast<uint8_t>(bits >> 16);
      t.hi[m] = static_cast<uint8_t>(bits >> 24);
    }
  }
};

const Tables& tables_for(DType format) {
  static const FormatTables tables;
  return format == DType::kFloat8E4M3 ? tables.e4m3 : tables.e5m2;
}

// The tables in registers: two 64-byte halves each.
struct Lookup {
  __m512i lo0, lo1, hi0, hi1;
};

PAGODA_VBMI_TARGET inline Lookup load_lookup(const Tables& t) {
  return {_mm512_load_si512(t.lo), _mm512_load_si512(t.lo + 64), _mm512_load_si512(t.hi),
          _mm512_load_si512(t.hi + 64)};
}

// Interleaves work inside 128-bit lanes: byte-to-word interleave k of lane L
// takes bytes 16L + 8k .. +7, word-to-dword interleave k of those the
// quarter 4k .. 4k+3 of them. The codes are permuted first so that each
// output vector holds consecutive elements.
// fp32: output vector k (elements 16k .. 16k+15), lane L, dword i comes from
// permuted byte 16L + 4k + i, which must be code 16k + 4L + i.
// bf16: output vector k (elements 32k .. 32k+31), lane L, word i comes from
// permuted byte 16L + 8k + i, which must be code 32k + 8L + i.
// Packed V (bf16::pack_v's layout): two rows' codes side by side, the first
// row's 64 codes as indices 0..63 and the second's as 64..127. Output vector
// `half` of permutation h holds the stretch of 16 elements s = 2h + half of
// the 64, as (first, second) pairs: its word w = 2e + i, lane L = w / 8,
// comes from permuted byte 16L + 8 half + w % 8, which must be code
// 16s + e of row i.
struct Orders {
  alignas(64) uint8_t f32[64];
  alignas(64) uint8_t bf16[64];
  alignas(64) uint8_t pairs[2][64];
  Orders() {
    for (int h = 0; h < 2; ++h) {
      for (int half = 0; half < 2; ++half) {
        for (int w = 0; w < 32; ++w) {
          const int e = w / 2;
          const int row = w % 2;
          pairs[h][16 * (w / 8) + 8 * half + w % 8] = static_cast<uint8_t>(64 * row + 16 * (2 * h + half) + e);
        }
      }
    }
    for (int l = 0; l < 4; ++l) {
      for (int k = 0; k < 4; ++k) {
        for (int i = 0; i < 4; ++i) f32[16 * l + 4 * k + i] = static_cast<uint8_t>(16 * k + 4 * l + i);
      }
      for (int k = 0; k < 2; ++k) {
        for (int i = 0; i < 8; ++i) bf16[16 * l + 8 * k + i] = static_cast<uint8_t>(32 * k + 8 * l + i);
      }
    }
  }
};

const Orders& orders() {
  static const Orders o;
  return o;
}

// 64 codes, already arranged, as their bf16 words in two vectors: low bytes
// and high bytes looked up by magnitude, interleaved inside 128-bit lanes.
PAGODA_VBMI_TARGET inline void widen_arranged(__m512i c, const Lookup& t, __m512i& w0, __m512i& w1) {
  const __m512i lo = _mm512_permutex2var_epi8(t.lo0, c, t.lo1);  // index bits 0..6: bit 7 (the sign) unused
  __m512i hi = _mm512_permutex2var_epi8(t.hi0, c, t.hi1);
  hi = _mm512_ternarylogic_epi32(hi, c, _mm512_set1_epi8(static_cast<char>(0x80)), 0xF8);  // hi | (c & 0x80)
  w0 = _mm512_unpacklo_epi8(lo, hi);
  w1 = _mm512_unpackhi_epi8(lo, hi);
}

// 64 codes as their bf16 words in two vectors, in the order `order` arranges.
PAGODA_VBMI_TARGET inline void widen64(const uint8_t* in, const Lookup& t, __m512i order, __m512i& w0,
                                       __m512i& w1) {
  widen_arranged(_mm512_permutexvar_epi8(order, _mm512_loadu_si512(in)), t, w0, w1);
}

}  // namespace

// VBMI and F16C from CPUID (leaf 7 ECX bit 1, leaf 1 ECX bit 29): clang's
// __builtin_cpu_supports knows neither name; AVX-512 F and BW from the
// builtin, which also asks the OS for the 512-bit register state.
bool available() {
  static const bool has = [] {
    unsigned a = 0, b = 0, c = 0, d = 0;
    if (__get_cpuid_count(7, 0, &a, &b, &c, &d) == 0 || (c & (1u << 1)) == 0) return false;
    if (__get_cpuid(1, &a, &b, &c, &d) == 0 || (c & (1u << 29)) == 0) return false;
    return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw");
  }();
  return has;
}

uint32_t widened_bits(DType format, uint8_t code) {
  const Tables& t = tables_for(format);
  const uint32_t m = code & 0x7Fu;
  return (static_cast<uint32_t>(t.hi[m] | (code & 0x80u)) << 24) | (static_cast<uint32_t>(t.lo[m]) << 16);
}

PAGODA_VBMI_TARGET void rows_to_f32(DType format, const uint8_t* in, int64_t stride, int64_t n, int32_t width,
                                    float* out) {
  const Lookup t = load_lookup(tables_for(format));
  const __m512i order = _mm512_load_si512(orders().f32);
  const __m512i zero = _mm512_setzero_si512();
  for (int64_t r = 0; r < n; ++r, in += stride) {
    for (int32_t i = 0; i < width; i += 64, out += 64) {
      __m512i w0, w1;
      widen64(in + i, t, order, w0, w1);
      _mm512_storeu_si512(out, _mm512_unpacklo_epi16(zero, w0));
      _mm512_storeu_si512(out + 16, _mm512_unpackhi_epi16(zero, w0));
      _mm512_storeu_si512(out + 32, _mm512_unpacklo_epi16(zero, w1));
      _mm512_storeu_si512(out + 48, _mm512_unpackhi_epi16(zero, w1));
    }
  }
}

PAGODA_VBMI_TARGET void rows_to_bf16(DType format, const uint8_t* in, int64_t stride, int64_t n, int32_t width,
                                     uint16_t* out) {
  const Lookup t = load_lookup(tables_for(format));
  const __m512i order = _mm512_load_si512(orders().bf16);
  for (int64_t r = 0; r < n; ++r, in += stride) {
    for (int32_t i = 0; i < width; i += 64, out += 64) {
      __m512i w0, w1;
      widen64(in + i, t, order, w0, w1);
      _mm512_storeu_si512(out, w0);
      _mm512_storeu_si512(out + 32, w1);
    }
  }
}

PAGODA_VBMI_TARGET void pack_k(DType format, const uint8_t* k, int64_t stride, int32_t n, int32_t d,
                               uint16_t* kb) {
  const Lookup t = load_lookup(tables_for(format));
  for (int32_t c = 0; c < d / 64; ++c) {
    // 64 codes (32 pairs) of each of the 16 keys, code 0 (+0) past n.
    __m512i x[bf16::kTileRows];
    for (int j = 0; j < bf16::kTileRows; ++j) {
      x[j] = j < n ? _mm512_loadu_si512(k + j * stride + 64 * c) : _mm512_setzero_si512();
    }
    // Pairs of keys interleaved pair by pair, then pairs of those: b[4g + q],
    // 128-bit lane l, holds pairs 8l + 2q and 8l + 2q + 1 of keys 4g .. 4g+3,
    // the four keys' first pair, then their second: what widen_arranged needs
    // to give each key's pair its own word.
    __m512i a[bf16::kTileRows];
    for (int i = 0; i < 8; ++i) {
      a[2 * i] = _mm512_unpacklo_epi16(x[2 * i], x[2 * i + 1]);
      a[2 * i + 1] = _mm512_unpackhi_epi16(x[2 * i], x[2 * i + 1]);
    }
    __m512i b[bf16::kTileRows];
    for (int g = 0; g < 4; ++g) {
      b[4 * g + 0] = _mm512_unpacklo_epi32(a[4 * g], a[4 * g + 2]);
      b[4 * g + 1] = _mm512_unpackhi_epi32(a[4 * g], a[4 * g + 2]);
      b[4 * g + 2] = _mm512_unpacklo_epi32(a[4 * g + 1], a[4 * g + 3]);
      b[4 * g + 3] = _mm512_unpackhi_epi32(a[4 * g + 1], a[4 * g + 3]);
    }
    // Lane l of the output for (l, q) gathers lane l of b[q], b[4 + q],
    // b[8 + q], b[12 + q]: the 16 keys' pairs 8l + 2q and 8l + 2q + 1.
    for (int q = 0; q < 4; ++q) {
      const __m512i e0 = _mm512_shuffle_i32x4(b[q], b[4 + q], 0x44);
      const __m512i e1 = _mm512_shuffle_i32x4(b[q], b[4 + q], 0xEE);
      const __m512i f0 = _mm512_shuffle_i32x4(b[8 + q], b[12 + q], 0x44);
      const __m512i f1 = _mm512_shuffle_i32x4(b[8 + q], b[12 + q], 0xEE);
      const __m512i lanes[4] = {_mm512_shuffle_i32x4(e0, f0, 0x88), _mm512_shuffle_i32x4(e0, f0, 0xDD),
                                _mm512_shuffle_i32x4(e1, f1, 0x88), _mm512_shuffle_i32x4(e1, f1, 0xDD)};
      for (int l = 0; l < 4; ++l) {
        __m512i w0, w1;
        widen_arranged(lanes[l], t, w0, w1);
        uint16_t* out = kb + 32 * (32 * c + 8 * l + 2 * q);
        _mm512_storeu_si512(out, w0);
        _mm512_storeu_si512(out + 32, w1);
      }
    }
  }
}

PAGODA_VBMI_TARGET void pack_v(DType format, const uint8_t* const* v, int32_t dv, uint16_t* vb,
                               bf16::Requests requests) {
  using bf16::kValuesPerTile;
  bf16::Spread spread(requests, bf16::kPvKeys / 2);
  const Lookup t = load_lookup(tables_for(format));
  const __m512i order[2] = {_mm512_load_si512(orders().pairs[0]), _mm512_load_si512(orders().pairs[1])};
  const __m512i zero = _mm512_setzero_si512();  // code 0 is +0 in both formats
  for (int k = 0; k < bf16::kPvKeys / 2; ++k) {
    const uint8_t* v0 = v[2 * k];
    const uint8_t* v1 = v[2 * k + 1];
    for (int32_t c = 0; c < dv / 64; ++c) {
      const __m512i x0 = v0 ? _mm512_loadu_si512(v0 + 64 * c) : zero;
      const __m512i x1 = v1 ? _mm512_loadu_si512(v1 + 64 * c) : zero;
      for (int h = 0; h < 2; ++h) {
        __m512i w0, w1;
        widen_arranged(_mm512_permutex2var_epi8(x0, order[h], x1), t, w0, w1);
        uint16_t* out = vb + static_cast<int64_t>(4 * c + 2 * h) * kValuesPerTile + 32 * k;
        _mm512_storeu_si512(out, w0);
        _mm512_storeu_si512(out + kValuesPerTile, w1);
      }
    }
    spread.tick();
  }
}

namespace {

// kRows rows over the 64 elements of chunk c: per pair of keys, their codes
// widened into the four packed vectors of the chunk's stretches (pack_v's, in
// element order) and each used by the rows against their broadcast weights.
// Each row's codes widened on their own (two lookups each, no arranging
// permute) and the two rows' words then interleaved took 1.11x the time of this
// loop, four rows with V in L1, where the loop without any widening takes 0.80x
// (AMD Zen 5, one pinned thread).
template <int kRows>
PAGODA_VBMI_BF16_TARGET inline void accumulate_rows_from_codes(const Lookup& t, const __m512i (&order)[2],
                                                               const uint16_t* pa, const uint8_t* const* v,
                                                               int32_t dv, float* acc, int64_t acc_stride,
                                                               bool first, bf16::Spread& spread) {
  for (int32_t c = 0; c < dv / 64; ++c) {
    __m512 a[kRows][4];
    for (int r = 0; r < kRows; ++r) {
      for (int s = 0; s < 4; ++s) {
        a[r][s] = first ? _mm512_setzero_ps() : _mm512_loadu_ps(acc + r * acc_stride + 64 * c + 16 * s);
      }
    }
    for (int k = 0; k < bf16::kPvKeys / 2; ++k) {
      const __m512i x0 = _mm512_loadu_si512(v[2 * k] + 64 * c);
      const __m512i x1 = _mm512_loadu_si512(v[2 * k + 1] + 64 * c);
      __m512i w[4];
      widen_arranged(_mm512_permutex2var_epi8(x0, order[0], x1), t, w[0], w[1]);
      widen_arranged(_mm512_permutex2var_epi8(x0, order[1], x1), t, w[2], w[3]);
      for (int r = 0; r < kRows; ++r) {
        int32_t pair;
        std::memcpy(&pair, pa + r * bf16::kPvKeys + 2 * k, sizeof(pair));
        const __m512bh p = reinterpret_cast<__m512bh>(_mm512_set1_epi32(pair));
        for (int s = 0; s < 4; ++s) a[r][s] = _mm512_dpbf16_ps(a[r][s], reinterpret_cast<__m512bh>(w[s]), p);
      }
      if (k % bf16::kPairsPerRequestTick == bf16::kPairsPerRequestTick - 1) spread.tick();
    }
    for (int r = 0; r < kRows; ++r) {
      for (int s = 0; s < 4; ++s) _mm512_storeu_ps(acc + r * acc_stride + 64 * c + 16 * s, a[r][s]);
    }
  }
}

alignas(64) constexpr uint8_t kZeroCodes[512] = {};  // code 0 is +0 in both formats

}  // namespace

PAGODA_VBMI_BF16_TARGET void accumulate_in_place(DType format, const uint16_t* pa, const uint8_t* const* v,
                                                 int32_t dv, float* acc, int64_t acc_stride, int32_t rows,
                                                 bool first, bf16::Requests requests) {
  const Lookup t = load_lookup(tables_for(format));
  const __m512i order[2] = {_mm512_load_si512(orders().pairs[0]), _mm512_load_si512(orders().pairs[1])};
  const uint8_t* codes[bf16::kPvKeys];
  for (int j = 0; j < bf16::kPvKeys; ++j) codes[j] = v[j] != nullptr ? v[j] : kZeroCodes;
  bf16::Spread spread(requests, dv / 64 * bf16::kRequestTicksPerPvGroup);
  switch (rows) {
    case 1: return accumulate_rows_from_codes<1>(t, order, pa, codes, dv, acc, acc_stride, first, spread);
    case 2: return accumulate_rows_from_codes<2>(t, order, pa, codes, dv, acc, acc_stride, first, spread);
    case 3: return accumulate_rows_from_codes<3>(t, order, pa, codes, dv, acc, acc_stride, first, spread);
    default: return accumulate_rows_from_codes<4>(t, order, pa, codes, dv, acc, acc_stride, first, spread);
  }
}

}  // namespace pagoda::cpu::fp8tab
