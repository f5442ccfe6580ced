// The fp8 cache formats (docs/design.md §9) against the reference written apart
// (reference/fp8_reference.h): every code's value, round-trips, ties to even,
// subnormals, saturation and random values; then every code as the CPU
// kernel reads it from the cache (both SIMD targets), and a decode with K/V
// scales against the reference on the dequantised cache.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "cpu/decode_cpu.h"
#include "pagoda/fp8.h"
#include "pagoda/host_convert.h"
#include "reference/decode_table.h"
#include "reference/fp8_reference.h"
#include "unit/cache_fixture.h"

namespace pagoda::testing {
namespace {

class Fp8 : public ::testing::TestWithParam<DType> {};

std::string format_name(const ::testing::TestParamInfo<DType>& info) { return std::string(dtype_name(info.param)); }

bool same_value(double a, float b) { return (std::isnan(a) && std::isnan(b)) || a == static_cast<double>(b); }

TEST_P(Fp8, EveryCodeDecodesToItsValue) {
  for (int c = 0; c < 256; ++c) {
    const auto code = static_cast<uint8_t>(c);
    EXPECT_TRUE(same_value(reference_fp8_value(code, GetParam()), fp8_to_float(code, GetParam())))
        << "code " << c << ": " << fp8_to_float(code, GetParam());
  }
}

TEST_P(Fp8, EveryFiniteCodeRoundTripsUnsaturated) {
  int finite = 0;
  for (int c = 0; c < 256; ++c) {
    const auto code = static_cast<uint8_t>(c);
    const float v = fp8_to_float(code, GetParam());
    if (!std::isfinite(v)) continue;
    ++finite;
    const Fp8Encoded e = float_to_fp8(v, GetParam());
    EXPECT_EQ(e.code, code) << "value " << v;
    EXPECT_FALSE(e.saturated) << "value " << v;
  }
  EXPECT_EQ(finite, GetParam() == DType::kFloat8E4M3 ? 254 : 248);  // e4m3: 2 NaNs; e5m2: 2 infinities, 6 NaNs
}

// Between two neighbouring finite codes: the midpoint goes to the even
// mantissa, anything off it to the nearer code.
TEST_P(Fp8, TiesGoToTheEvenMantissaAndOthersToTheNearest) {
  const DType t = GetParam();
  for (int c = 0; c < 0x7F; ++c) {
    const float lo = fp8_to_float(static_cast<uint8_t>(c), t);
    const float hi = fp8_to_float(static_cast<uint8_t>(c + 1), t);
    if (!std::isfinite(hi)) break;
    const float mid = lo + (hi - lo) / 2;  // exact: one bit more than fp8 holds
    for (float sign : {1.f, -1.f}) {
      const uint8_t s = sign < 0 ? 0x80 : 0;
      const uint8_t even = static_cast<uint8_t>(((c & 1) == 0 ? c : c + 1) | s);
      EXPECT_EQ(float_to_fp8(sign * mid, t).code, even) << "midpoint " << sign * mid;
      EXPECT_EQ(float_to_fp8(sign * std::nextafter(mid, 0.f), t).code, c | s) << sign * mid;
      EXPECT_EQ(float_to_fp8(sign * std::nextafter(mid, INFINITY), t).code, (c + 1) | s) << sign * mid;
    }
  }
}

TEST_P(Fp8, SubnormalsAndZeroKeepTheirSign) {
  const DType t = GetParam();
  const float smallest = t == DType::kFloat8E4M3 ? 0x1p-9f : 0x1p-16f;
  EXPECT_EQ(float_to_fp8(smallest, t).code, 0x01);
  EXPECT_EQ(float_to_fp8(smallest / 2, t).code, 0x00);          // a tie: to the even code, 0
  EXPECT_EQ(float_to_fp8(smallest * 0.75f, t).code, 0x01);
  EXPECT_EQ(float_to_fp8(-smallest * 0.25f, t).code, 0x80);     // -0
  EXPECT_EQ(float_to_fp8(-0.f, t).code, 0x80);
  EXPECT_EQ(float_to_fp8(1e-30f, t).code, 0x00);
  EXPECT_EQ(fp8_to_float(0x01, t), smallest);
}

TEST_P(Fp8, AboveTheLargestFiniteValueSaturatesAndSaysSo) {
  const DType t = GetParam();
  const float max = static_cast<float>(reference_fp8_max(t));
  const uint8_t max_code = t == DType::kFloat8E4M3 ? 0x7E : 0x7B;
  EXPECT_EQ(float_to_fp8(max, t).code, max_code);
  EXPECT_FALSE(float_to_fp8(max, t).saturated);
  for (float x : {std::nextafter(max, INFINITY), max * 1.1f, 1e30f, INFINITY}) {
    const Fp8Encoded pos = float_to_fp8(x, t);
    const Fp8Encoded neg = float_to_fp8(-x, t);
    EXPECT_EQ(pos.code, max_code) << x;
    EXPECT_TRUE(pos.saturated) << x;
    EXPECT_EQ(neg.code, max_code | 0x80) << -x;
    EXPECT_TRUE(neg.saturated) << -x;
  }
  EXPECT_TRUE(std::isnan(fp8_to_float(float_to_fp8(NAN, t).code, t)));
}

TEST_P(Fp8, RandomValuesEncodeAsTheReferenceDoes) {
  const DType t = GetParam();
  std::mt19937_64 rng(8);
  std::uniform_real_distribution<double> log_magnitude(-24.0, 20.0);
  for (int i = 0; i < 100000; ++i) {
    const float x = static_cast<float>((i & 1 ? -1 : 1) * std::exp2(log_magnitude(rng)));
    const Fp8Encoded e = float_to_fp8(x, t);
    ASSERT_EQ(e.code, reference_fp8_encode(x, t)) << "x = " << x;
    ASSERT_EQ(e.saturated, std::abs(x) > reference_fp8_max(t)) << "x = " << x;
  }
}

TEST_P(Fp8, BulkConversionAndNonFiniteScanAgree) {
  const DType t = GetParam();
  std::vector<uint8_t> codes(256);
  for (int c = 0; c < 256; ++c) codes[static_cast<size_t>(c)] = static_cast<uint8_t>(c);
  std::vector<float> values(256);
  convert_to_float(codes.data(), t, values.data(), 256);
  int64_t first_bad = -1;
  for (int c = 0; c < 256; ++c) {
    EXPECT_TRUE(same_value(reference_fp8_value(static_cast<uint8_t>(c), t), values[static_cast<size_t>(c)]));
    if (first_bad < 0 && !std::isfinite(values[static_cast<size_t>(c)])) first_bad = c;
  }
  EXPECT_EQ(first_non_finite(codes.data(), t, 256), first_bad);
  EXPECT_EQ(first_non_finite(codes.data(), t, 0x70), -1);
}

INSTANTIATE_TEST_SUITE_P(Formats, Fp8, ::testing::Values(DType::kFloat8E4M3, DType::kFloat8E5M2), format_name);

// ---- the CPU kernel's reads ---------------------------------------------------

struct KernelReadCase {
  DType format;
  const char* target;
};

class Fp8KernelReads : public ::testing::TestWithParam<KernelReadCase> {
 protected:
  void SetUp() override {
    const Status s = cpu::select_simd_target(GetParam().target);
    if (s.code() == StatusCode::kFailedPrecondition) GTEST_SKIP() << s.message();
    ASSERT_TRUE(s.ok()) << s.message();
  }
  void TearDown() override { EXPECT_TRUE(cpu::select_simd_target("best").ok()); }
};

// One-token sequences, one per 64 codes: the output of a lone key is its V row
// exactly (weight 1), and with q = e_j the LSE is K[j] (to fp32 rounding of the
// scores). Codes the append path cannot store (e5m2's infinities, NaNs other
// than the canonical S.1111.111) are the only ones skipped. A NaN in K would
// poison every score of its row (0 * NaN), so K holds 0 where V holds a NaN.
TEST_P(Fp8KernelReads, EveryCodeReadsAsItsValue) {
  const DType t = GetParam().format;
  CacheGeometry g;
  g.num_layers = 1;
  g.num_kv_heads = 1;
  g.num_q_heads = 1;
  g.head_dim = 64;
  g.block_size = 16;
  g.dtype = t;
  g.num_blocks = 8;
  FixtureOptions o;
  o.geometry = g;
  o.seed = 3;
  CacheFixture f(o);
  int checked = 0;
  for (int first = 0; first < 256; first += 64) {
    std::vector<float> k_row(64), v_row(64);
    for (int i = 0; i < 64; ++i) {
      v_row[static_cast<size_t>(i)] = fp8_to_float(static_cast<uint8_t>(first + i), t);
      k_row[static_cast<size_t>(i)] = std::isnan(v_row[static_cast<size_t>(i)]) ? 0.f : v_row[static_cast<size_t>(i)];
    }
    const SequenceId id = f.cache().create("codes");
    f.append_rows(id, 0, 1, k_row, v_row);
    for (int j = 0; j < 64; ++j) {
      const auto code = static_cast<uint8_t>(first + j);
      const float want = fp8_to_float(code, t);
      if (std::isinf(want) || (std::isnan(want) && (code & 0x7F) != 0x7F)) continue;
      CacheFixture::Queries q;
      q.dtype = DType::kFloat32;
      q.values.assign(64, 0.f);
      q.values[static_cast<size_t>(j)] = 1.f;
      q.bytes.resize(64 * 4);
      std::memcpy(q.bytes.data(), q.values.data(), 64 * 4);
      const auto got = f.decode(0, {id}, q, 1.f, SplitMode::kDeterministic, 512);
      EXPECT_TRUE(same_value(want, got.out[static_cast<size_t>(j)])) << "V code " << int(code) << ": " << got.out[j];
      const float want_k = std::isnan(want) ? 0.f : want;
      EXPECT_NEAR(got.lse[0], want_k, 2e-6 * std::abs(want_k) + 1e-12) << "K code " << int(code);
      ++checked;
    }
  }
  EXPECT_EQ(checked, t == DType::kFloat8E4M3 ? 256 : 250);
}

// An e4m3 NaN code inside a block longer than the kernel's tile: the rows
// read in place stop before its run, which is widened a tile at a time (a
// block of 256 rows, where the tile holds 16 at head_dim 256). Column 5 of the NaN token's V is
// NaN in every output; the rest, and the LSE, match the reference.
TEST_P(Fp8KernelReads, NanCodeInALongBlockIsReadATileAtATime) {
  if (GetParam().format != DType::kFloat8E4M3) GTEST_SKIP() << "only e4m3 scans its rows for NaN codes";
  constexpr int kD = 256;  // a whole block of these rows is more than the task's scratch holds
  CacheGeometry g;
  g.num_layers = 1;
  g.num_kv_heads = 1;
  g.num_q_heads = 4;  // GQA 4: the FMAs read the cache in place (best may give e4m3 to the dot products)
  g.head_dim = kD;
  g.block_size = 256;
  g.dtype = DType::kFloat8E4M3;
  g.num_blocks = 4;
  FixtureOptions o;
  o.geometry = g;
  o.seed = 5;
  CacheFixture f(o);
  const SequenceId id = f.add_sequence(0, 100);
  std::vector<float> k_row(kD), v_row(kD);
  for (int i = 0; i < kD; ++i) {
    k_row[static_cast<size_t>(i)] = 0.25f * static_cast<float>(i % 7) - 0.75f;
    v_row[static_cast<size_t>(i)] = 0.5f * static_cast<float>(i % 5) - 1.f;
  }
  v_row[5] = std::numeric_limits<float>::quiet_NaN();
  f.append_rows(id, 0, 1, k_row, v_row);
  f.append_random(id, 0, 199);  // 300 tokens: the NaN token at 100, inside block 0
  const auto q = f.random_queries(1, DType::kFloat32);
  const auto got = f.decode(0, {id}, q, 0.088f, SplitMode::kDeterministic, 512);
  // Where a matrix unit takes the cache, its bf16 arithmetic and bound.
  const Arithmetic arithmetic = arithmetic_of("cpu", g);
  const bool tiles = arithmetic == Arithmetic::kBf16Tiles;
  const auto want = f.reference(0, {id}, as_multiplied(q, arithmetic), 0.088);
  ASSERT_EQ(got.out.size(), want.out.size());
  for (size_t i = 0; i < want.out.size(); ++i) {
    const size_t head = i / kD;
    if (i % kD == 5) {
      EXPECT_TRUE(std::isnan(got.out[i])) << "head " << head;
    } else {
      const double allowed = bounds_for(DType::kFloat32).max_abs + (tiles ? tile_output_error(want, head) : 0.0);
      EXPECT_NEAR(got.out[i], want.out[i], allowed) << "head " << head << ", " << i % kD;
    }
  }
  for (size_t h = 0; h < want.lse.size(); ++h) {
    EXPECT_NEAR(got.lse[h], want.lse[h], 1e-4 + (tiles ? tile_score_error(want, h) : 0.0)) << "head " << h;
  }
}

// The FMA kernels read an fp8 cache as the fp16 values of its codes (AVX2 through
// a tile of those fp16 values, AVX-512 in place or through an fp32 tile), in the
// same chains as an fp16 cache: so an fp8 cache gives the bits an fp16 cache
// holding the same values gives. Groups of 4 and 3 (blocks of 4, and of 2 + 1),
// one and four query rows, blocks of 16 and 3 tokens, every finite code (the
// NaN code's reads are the two tests above).
//
// e4m3 reads 2^-8 of each value (fp8_read_factor), so a P.V sum that cancels
// down near fp32's subnormals (V's few-bit values, both signs) rounds there on
// a grid 2^8 coarser: such elements (the test meets a few, around 1e-41, off
// by about 2^-142) are held to 2^-130 instead of bit for bit.
TEST_P(Fp8KernelReads, AnFp8CacheGivesTheBitsOfAnFp16CacheOfItsValues) {
  constexpr float kNormalEnough = 0x1p-100f;
  constexpr float kSubnormalSlack = 0x1p-130f;
  if (std::string(GetParam().target) == "best") GTEST_SKIP() << "best may give fp8 to the dot products";
  const DType t = GetParam().format;
  std::vector<float> values;  // every finite code's value
  for (int c = 0; c < 256; ++c) {
    const float x = fp8_to_float(static_cast<uint8_t>(c), t);
    if (std::isfinite(x)) values.push_back(x);
  }
  for (const int32_t q_heads : {8, 6}) {
    for (const int32_t block_size : {16, 3}) {
      SCOPED_TRACE(fmt::format("{} q heads, block {}", q_heads, block_size));
      CacheGeometry g;
      g.num_layers = 1;
      g.num_kv_heads = 2;
      g.num_q_heads = q_heads;
      g.head_dim = 128;
      g.block_size = block_size;
      g.num_blocks = 512;
      g.dtype = t;
      CacheGeometry g16 = g;
      g16.dtype = DType::kFloat16;
      CacheFixture f8(FixtureOptions(g, 1, 11));
      CacheFixture f16(FixtureOptions(g16, 1, 11));
      const std::vector<int32_t> lengths = {40, 300, 7};
      std::uniform_int_distribution<size_t> pick(0, values.size() - 1);
      std::vector<SequenceId> ids8, ids16;
      for (const int32_t n : lengths) {
        const size_t count = static_cast<size_t>(n) * g.num_kv_heads * g.head_dim;
        std::vector<float> k(count), v(count);
        for (size_t i = 0; i < count; ++i) {
          k[i] = values[pick(f8.rng())];
          v[i] = values[pick(f8.rng())];
        }
        ids8.push_back(f8.cache().create(fmt::format("s{}", ids8.size())));
        ids16.push_back(f16.cache().create(fmt::format("s{}", ids16.size())));
        f8.append_rows(ids8.back(), 0, n, k, v);
        f16.append_rows(ids16.back(), 0, n, k, v);
      }
      for (const int32_t q_len : {1, 4}) {
        SCOPED_TRACE(fmt::format("q_len {}", q_len));
        CacheFixture::Variant rows;
        rows.q_lengths.assign(lengths.size(), q_len);
        const CacheFixture::Queries q =
            f8.random_queries(static_cast<int32_t>(lengths.size()) * q_len, DType::kFloat32);
        const auto got = f8.decode(0, ids8, q, 0.088f, SplitMode::kDeterministic, 64, rows);
        const auto want = f16.decode(0, ids16, q, 0.088f, SplitMode::kDeterministic, 64, rows);
        ASSERT_EQ(got.out.size(), want.out.size());
        for (size_t i = 0; i < got.out.size(); ++i) {
          if (std::abs(want.out[i]) >= kNormalEnough) {
            ASSERT_EQ(std::memcmp(&got.out[i], &want.out[i], sizeof(float)), 0)
                << "element " << i << ": " << got.out[i] << " against " << want.out[i];
          } else {
            ASSERT_NEAR(got.out[i], want.out[i], kSubnormalSlack) << "element " << i;
          }
        }
        EXPECT_EQ(std::memcmp(got.lse.data(), want.lse.data(), got.lse.size() * sizeof(float)), 0);
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Targets, Fp8KernelReads,
                         ::testing::Values(KernelReadCase{DType::kFloat8E4M3, "best"},
                                           KernelReadCase{DType::kFloat8E5M2, "best"},
                                           // AVX-512's FMAs, where best gives e4m3 to the dot products
                                           KernelReadCase{DType::kFloat8E4M3, "avx3"},
                                           KernelReadCase{DType::kFloat8E5M2, "avx3"},
                                           KernelReadCase{DType::kFloat8E4M3, "avx2"},
                                           KernelReadCase{DType::kFloat8E5M2, "avx2"}),
                         [](const ::testing::TestParamInfo<KernelReadCase>& info) {
                           return fmt::format("{}_{}", dtype_name(info.param.format), info.param.target);
                         });

// Scales (stored = x / scale): K and V of a layer stored small, read back
// scaled; against the reference on the dequantised cache, with values that
// saturate counted.
TEST(Fp8Scales, DecodeWithScalesMatchesTheReferenceOnTheDequantisedCache) {
  for (DType t : {DType::kFloat8E4M3, DType::kFloat8E5M2}) {
    SCOPED_TRACE(dtype_name(t));
    CacheGeometry g;
    g.num_layers = 2;
    g.num_kv_heads = 2;
    g.num_q_heads = 8;
    g.head_dim = 128;
    g.block_size = 16;
    g.dtype = t;
    g.num_blocks = 256;
    FixtureOptions o;
    o.geometry = g;
    o.threads = 2;
    o.seed = 11;
    o.kv_scales = {KvScale{0.01f, 0.02f}, KvScale{4.f, 0.5f}};
    CacheFixture f(o);
    for (int32_t layer : {0, 1}) {
      const std::vector<SequenceId> ids = {f.add_sequence(layer, 900), f.add_sequence(layer, 33)};
      const auto q = f.random_queries(2, DType::kFloat32);
      const auto got = f.decode(layer, ids, q, 0.088f, SplitMode::kDeterministic, 512);
      const Arithmetic arithmetic = arithmetic_of("cpu", g);
      const auto want = f.reference(layer, ids, as_multiplied(q, arithmetic), 0.088);
      expect_matches_reference(got.out, got.lse, want, DType::kFloat32, arithmetic);
    }
  }
}

}  // namespace
}  // namespace pagoda::testing
