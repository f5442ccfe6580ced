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

// Bounds per output dtype: the reference sees the same rounded K/V/q, so the
// error is fp32 accumulation (~1e-6 on |o| < 1 over 4,097 tokens) plus the final
// rounding of o to q's dtype: half an ulp at |o| < 1 is 2^-11 (fp16) or 2^-8
// (bf16). NMSE bounds sit two orders below ggml's 5e-4.
struct Bounds {
  double max_abs;
  double nmse;
};
inline Bounds bounds_for(DType out) {
  switch (out) {
    case DType::kFloat32: return {2e-5, 1e-9};
    case DType::kFloat16: return {1e-3, 1e-6};
    case DType::kBFloat16: return {8e-3, 3e-5};
  }
  return {0, 0};
}

struct DecodeCase {
  int32_t head_dim;
  int32_t gqa;
  int32_t block_size;
  DType cache;
  DType q;
};

inline std::string to_string(const DecodeCase& c) {
  return fmt::format("d{}_gqa{}_bs{}_kv{}_q{}", c.head_dim, c.gqa, c.block_size, dtype_name(c.cache),
                     dtype_name(c.q));
}

// GoogleTest prints a failing case's parameters with this.
inline void PrintTo(const DecodeCase& c, std::ostream* os) { *os << to_string(c); }

inline std::string case_name(const ::testing::TestParamInfo<DecodeCase>& info) { return to_string(info.param); }

// head_dim {64, 128, 256} x GQA {1, 4, 8} x block size {1, 3, 7, 16} x cache
// dtype, with q in fp32 against every cache dtype and q in the cache's own dtype.
inline std::vector<DecodeCase> decode_table() {
  std::vector<DecodeCase> cases;
  for (int32_t d : {64, 128, 256})
    for (int32_t gqa : {1, 4, 8})
      for (int32_t bs : {1, 3, 7, 16})
        for (DType cache : {DType::kFloat32, DType::kFloat16, DType::kBFloat16})
          for (DType q : {DType::kFloat32, DType::kFloat16, DType::kBFloat16})
            if (q == DType::kFloat32 || q == cache) cases.push_back({d, gqa, bs, cache, q});
  return cases;
}

// Checks one decode of the table's batch (kTableLengths) against the reference:
// error bounds of q's dtype, no NaN, LSE (-inf exactly for empty sequences),
// chunk counts from the launch's chunk length, and zero output for length 0.
// Decoded: any type with out, lse (fp32 vectors), splits and chunk_tokens.
template <typename Decoded>
void expect_table_decode(const CacheGeometry& g, const Decoded& got, const ReferenceResult& want, DType q_dtype) {
  const Bounds bound = bounds_for(q_dtype);
  const ErrorStats e = compare(want.out, got.out);
  EXPECT_FALSE(e.has_nan);
  EXPECT_LE(e.max_abs, bound.max_abs);
  EXPECT_LE(e.nmse, bound.nmse);
  for (size_t i = 0; i < want.lse.size(); ++i) {
    if (std::isinf(want.lse[i])) {
      EXPECT_EQ(got.lse[i], -INFINITY) << "row " << i;
    } else {
      EXPECT_NEAR(got.lse[i], want.lse[i], 1e-4 * std::max(1.0, std::abs(want.lse[i]))) << "row " << i;
    }
  }
  const int32_t row = g.num_q_heads * g.head_dim;
  for (size_t b = 0; b < std::size(kTableLengths); ++b) {
    EXPECT_EQ(got.splits[b], (kTableLengths[b] + got.chunk_tokens - 1) / got.chunk_tokens) << "sequence " << b;
    if (kTableLengths[b] != 0) continue;
    for (int32_t i = 0; i < row; ++i) ASSERT_EQ(got.out[b * row + i], 0.f) << "sequence " << b;
  }
}

}  // namespace pagoda::testing
