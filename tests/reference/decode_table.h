#pragma once
// The declared shape table every backend's decode test runs, and the error
// bounds per output dtype. One table, so the CPU and CUDA suites cannot drift.

#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <iterator>
#include <ostream>
#include <string>
#include <vector>

#include "pagoda/dtype.h"
#include "pagoda/paged_kv.h"
#include "reference/naive_attention.h"

namespace pagoda::testing {

// Sequence lengths of the batch each case decodes: empty, one token, block
// edges, and long sequences across several 512-token chunks.
inline constexpr int32_t kTableLengths[] = {0, 1, 15, 16, 17, 1000, 4097};
inline constexpr int32_t kTableLayer = 1;  // layer 0 stays NaN: a wrong layer offset shows
inline constexpr int32_t kTableKvHeads = 2;
inline constexpr int32_t kTableSplitTokens = 512;

// Bounds per output dtype, from where the error comes. The reference sees the
// same rounded K, V and q, so the kernel's error has two parts:
//  - fp32 accumulation (scores, exp2, the online sums, the merge): an allowance
//    of kAccumulationAbs = 2e-5 absolute and kAccumulationNmse = 1e-9 (seen:
//    about 2e-6 absolute over 4,097 tokens);
//  - the final rounding of o to q's dtype: at most half an ulp. Every fixture
//    draws V from [-1, 1], so |o| <= 1 (o is a convex combination of V rows),
//    and half an ulp there is at most 2^-12 for fp16 (ulp 2^-11 on [0.5, 1))
//    and 2^-9 for bf16 (ulp 2^-8 on [0.5, 1)).
// Max abs error is then the sum of the two. For NMSE, each element's rounding
// error is at most 2^-11 |o| (fp16) or 2^-8 |o| (bf16), so the rounding alone
// gives sum(err^2) / sum(o^2) <= 2^-22 or 2^-16; with the accumulation term
// (triangle inequality in the 2-norm) NMSE <= (sqrt(rounding) + sqrt(1e-9))^2.
// A comparison of two backends, each within these of the reference, uses
// twice the max abs and four times the NMSE (between_backends).
struct Bounds {
  double max_abs;
  double nmse;
};
inline constexpr double kAccumulationAbs = 2e-5;
inline constexpr double kAccumulationNmse = 1e-9;
inline Bounds bounds_for(DType out) {
  const auto with_rounding = [](double half_ulp_at_one, double relative) {
    const double root = relative + std::sqrt(kAccumulationNmse);
    return Bounds{half_ulp_at_one + kAccumulationAbs, root * root};
  };
  switch (out) {
    case DType::kFloat32: return {kAccumulationAbs, kAccumulationNmse};
    case DType::kFloat16: return with_rounding(0x1p-12, 0x1p-11);
    case DType::kBFloat16: return with_rounding(0x1p-9, 0x1p-8);
    case DType::kFloat8E4M3:
    case DType::kFloat8E5M2: break;  // never an output dtype
  }
  return {0, 0};
}
inline Bounds between_backends(DType out) {
  const Bounds b = bounds_for(out);
  return {2 * b.max_abs, 4 * b.nmse};
}

// How a backend multiplies: fp32 FMAs throughout, or bf16 tiles (the CPU's
// matrix units for bf16 and fp8 caches, AMX tiles and AVX512-BF16 dot
// products alike): q rounded to bf16 once, each softmax weight p rounded to
// bf16 before P.V, products exact (bf16 x bf16 fits fp32's 24-bit
// significand), sums in fp32 (a dot product adds a pair of products with at
// most two roundings: d in a chain of d products, as on the FMAs).
enum class Arithmetic { kFp32, kBf16Tiles };

// The bf16 tiles' extra error, per row, against a reference given q as the
// tiles read it (rounded to bf16: the rounding of an input, as K's and V's to
// the cache dtype are). With d = head_dim, A = max over the row's keys of
// scale * sum_i |q_i k_i| (natural units) and Vmax = max |v| over them:
//  - a score is d exact products summed in fp32, then scaled: by the classic
//    dot-product bound it moves by at most D = gamma(d + 1) A, gamma(n) =
//    n u / (1 - n u), u = 2^-24. A soft cap c tanh(s / c) is 1-Lipschitz:
//    D bounds the capped score too.
//  - each weight w_j = e^s_j / sum e^s then moves by a factor within
//    [e^-2D, e^2D], so o = sum w_j v_j moves by at most (e^2D - 1) Vmax and
//    LSE = log sum e^s by at most D.
//  - P.V reads each p_j rounded to nearest bf16 (relative 2^-9: 8 significand
//    bits) while the denominator l sums the unrounded p_j: each term of
//    sum p_j v_j / l moves by at most 2^-9 of its size, 2^-9 Vmax in all
//    (weights under 2^-126 flush to zero: at most n 2^-126, below fp32's
//    resolution of o).
// They add to the fp32 allowance and the output rounding of bounds_for.
inline double tile_score_error(const ReferenceResult& want, size_t row) {
  const double nu = (want.head_dim + 1) * 0x1p-24;
  return nu / (1 - nu) * want.score_abs[row];
}
inline double tile_output_error(const ReferenceResult& want, size_t row) {
  return (std::expm1(2 * tile_score_error(want, row)) + 0x1p-9) * want.value_abs[row];
}

struct DecodeCase {
  int32_t head_dim;
  int32_t gqa;
  int32_t block_size;
  DType cache;
  DType q;
  int32_t v_head_dim = 0;  // 0: head_dim; less: latent attention, V the prefix of K's row
  int32_t kv_heads = kTableKvHeads;
};

// The cache of one case: its KV heads (kTableKvHeads unless latent), two layers, room for the
// table's lengths (each rounded up a block, for a spike) and spare blocks
// that stay free (and NaN).
inline CacheGeometry table_geometry(const DecodeCase& c) {
  CacheGeometry g;
  g.num_layers = 2;
  g.num_kv_heads = c.kv_heads;
  g.num_q_heads = c.kv_heads * c.gqa;
  g.head_dim = c.head_dim;
  g.v_head_dim = c.v_head_dim;
  g.block_size = c.block_size;
  g.dtype = c.cache;
  int32_t blocks = 8;
  for (int32_t len : kTableLengths) blocks += len / c.block_size + 1;
  g.num_blocks = blocks;
  return g;
}

inline std::string to_string(const DecodeCase& c) {
  const std::string latent = c.v_head_dim > 0 && c.v_head_dim < c.head_dim
                                 ? fmt::format("v{}_heads{}_", c.v_head_dim, c.kv_heads)
                                 : std::string();
  return fmt::format("d{}_{}gqa{}_bs{}_kv{}_q{}", c.head_dim, latent, c.gqa, c.block_size, dtype_name(c.cache),
                     dtype_name(c.q));
}

// GoogleTest prints a failing case's parameters with this.
inline void PrintTo(const DecodeCase& c, std::ostream* os) { *os << to_string(c); }

inline std::string case_name(const ::testing::TestParamInfo<DecodeCase>& info) { return to_string(info.param); }

// head_dim {64, 128, 256} x GQA {1, 4, 8} x block size {1, 3, 7, 16} x cache
// dtype, with q in fp32 against every cache dtype and q in the cache's own dtype
// (16- and 32-bit caches; fp8 is never a tensor dtype). For fp8 the reference
// reads the dequantised K/V, so the bounds are those of q's dtype all the same.
// Then latent attention (MLA, docs/design.md §16): one KV head whose 576-element
// rows are K and whose first 512 elements are V, with 16 query heads (block
// sizes 1 and 16) and 128 (block size 16: the heaviest rows of the table).
inline std::vector<DecodeCase> decode_table() {
  std::vector<DecodeCase> cases;
  const DType caches[] = {DType::kFloat32, DType::kFloat16, DType::kBFloat16, DType::kFloat8E4M3,
                          DType::kFloat8E5M2};
  const DType queries[] = {DType::kFloat32, DType::kFloat16, DType::kBFloat16};
  for (int32_t d : {64, 128, 256})
    for (int32_t gqa : {1, 4, 8})
      for (int32_t bs : {1, 3, 7, 16})
        for (DType cache : caches)
          for (DType q : queries)
            if (q == DType::kFloat32 || q == cache) cases.push_back({d, gqa, bs, cache, q});
  struct Latent {
    int32_t gqa;
    int32_t block_size;
  };
  for (const Latent l : {Latent{16, 1}, Latent{16, 16}, Latent{128, 16}})
    for (DType cache : caches)
      for (DType q : queries)
        if (q == DType::kFloat32 || q == cache) cases.push_back({576, l.gqa, l.block_size, cache, q, 512, 1});
  return cases;
}

// Bf16 tiles: each output element within out_abs plus its row's
// tile_output_error (the first miss reported), each LSE within lse_abs(i)
// plus tile_score_error, and -inf exactly where the reference has no keys.
template <typename LseAllowance>
void expect_within_tile_bounds(const std::vector<float>& out, const std::vector<float>& lse,
                               const ReferenceResult& want, double out_abs, const LseAllowance& lse_abs) {
  EXPECT_EQ(out.size(), want.out.size());
  const size_t width = want.out.size() / std::max<size_t>(1, want.lse.size());
  for (size_t i = 0; i < want.out.size() && i < out.size(); ++i) {
    const double allowed = out_abs + tile_output_error(want, i / width);
    if (!(std::abs(out[i] - want.out[i]) <= allowed)) {
      ADD_FAILURE() << "element " << i << " of row " << i / width << ": " << out[i] << " against " << want.out[i]
                    << ", allowed " << allowed;
      break;
    }
  }
  for (size_t i = 0; i < want.lse.size() && i < lse.size(); ++i) {
    if (std::isinf(want.lse[i])) {
      EXPECT_EQ(lse[i], -INFINITY) << "row " << i;
    } else {
      EXPECT_NEAR(lse[i], want.lse[i], lse_abs(i) + tile_score_error(want, i)) << "row " << i;
    }
  }
}

// Output within the error bounds of q's dtype and free of NaN; LSE within 1e-4
// (relative beyond 1), -inf exactly where the reference has no keys. Bf16
// tiles: expect_within_tile_bounds on top of those.
inline void expect_matches_reference(const std::vector<float>& out, const std::vector<float>& lse,
                                     const ReferenceResult& want, DType q_dtype,
                                     Arithmetic arithmetic = Arithmetic::kFp32) {
  const Bounds bound = bounds_for(q_dtype);
  const ErrorStats e = compare(want.out, out);
  EXPECT_FALSE(e.has_nan);
  const auto lse_abs = [&](size_t i) { return 1e-4 * std::max(1.0, std::abs(want.lse[i])); };
  if (arithmetic == Arithmetic::kBf16Tiles) return expect_within_tile_bounds(out, lse, want, bound.max_abs, lse_abs);
  EXPECT_LE(e.max_abs, bound.max_abs);
  EXPECT_LE(e.nmse, bound.nmse);
  for (size_t i = 0; i < want.lse.size(); ++i) {
    if (std::isinf(want.lse[i])) {
      EXPECT_EQ(lse[i], -INFINITY) << "row " << i;
    } else {
      EXPECT_NEAR(lse[i], want.lse[i], lse_abs(i)) << "row " << i;
    }
  }
}

// Checks one decode of the table's batch (kTableLengths) against the reference:
// error bounds of q's dtype, no NaN, LSE (-inf exactly for empty sequences),
// chunk counts from the launch's chunk length, and zero output for length 0.
// Decoded: any type with out, lse (fp32 vectors), splits and chunk_tokens.
template <typename Decoded>
void expect_table_decode(const CacheGeometry& g, const Decoded& got, const ReferenceResult& want, DType q_dtype,
                         Arithmetic arithmetic = Arithmetic::kFp32) {
  expect_matches_reference(got.out, got.lse, want, q_dtype, arithmetic);
  const int32_t row = g.num_q_heads * g.v_dim();
  for (size_t b = 0; b < std::size(kTableLengths); ++b) {
    EXPECT_EQ(got.splits[b], (kTableLengths[b] + got.chunk_tokens - 1) / got.chunk_tokens) << "sequence " << b;
    if (kTableLengths[b] != 0) continue;
    for (int32_t i = 0; i < row; ++i) ASSERT_EQ(got.out[b * row + i], 0.f) << "sequence " << b;
  }
}

}  // namespace pagoda::testing
