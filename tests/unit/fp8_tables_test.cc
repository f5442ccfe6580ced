// The fp8 byte-table widening (kernels/cpu/fp8_tables.h) against the fp8
// reference written apart: every code's widened value, rows of every code in
// every position with a stride wider than the row, nothing written past the
// rows; K and V packed for the dot products straight from their codes; then
// the kernel on an fp8 cache with and without the tables (the same bits), NaN
// codes inside the keys it reads, and the name it reports.
// On a CPU without AVX-512 VBMI every case skips and says so.
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "cpu/bf16_dot.h"
#include "cpu/decode_cpu.h"
#include "cpu/fp8_tables.h"
#include "pagoda/cpu_targets.h"
#include "reference/fp8_reference.h"
#include "unit/cache_fixture.h"

namespace pagoda::testing {
namespace {

constexpr DType kFormats[] = {DType::kFloat8E4M3, DType::kFloat8E5M2};

// What the kernel reads for `code`: its value, e4m3 at 2^-8 of it
// (cpu::fp8_read_factor).
double read_value(uint8_t code, DType format) {
  return reference_fp8_value(code, format) / static_cast<double>(cpu::fp8_read_factor(format));
}

class Fp8Tables : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!cpu::fp8tab::available()) GTEST_SKIP() << "this CPU has no AVX-512 VBMI: fp8 widens arithmetically here";
  }
  void TearDown() override {
    cpu::use_fp8_tables(true);
    EXPECT_TRUE(cpu::select_simd_target("best").ok());
  }
};

TEST_F(Fp8Tables, EveryCodeWidensToItsValueWithItsSign) {
  for (const DType format : kFormats) {
    for (int c = 0; c < 256; ++c) {
      const auto code = static_cast<uint8_t>(c);
      const uint32_t bits = cpu::fp8tab::widened_bits(format, code);
      const float got = std::bit_cast<float>(bits);
      const double want = read_value(code, format);
      EXPECT_EQ(bits & 0xFFFFu, 0u) << "code " << c << ": every fp8 value is a bf16 value";
      EXPECT_EQ(bits >> 31, static_cast<uint32_t>(c >> 7)) << "code " << c;
      if (std::isnan(want)) {
        EXPECT_TRUE(std::isnan(got)) << dtype_name(format) << " code " << c;
      } else {
        EXPECT_EQ(static_cast<double>(got), want) << dtype_name(format) << " code " << c;
      }
    }
  }
}

// Rows of width 512 read from rows 576 bytes apart (latent attention's V in
// K's rows), every code at every position modulo 64 somewhere.
TEST_F(Fp8Tables, RowsWidenElementByElementAndStopAtTheirEnd) {
  constexpr int32_t kWidth = 512;
  constexpr int64_t kStride = 576;
  constexpr int64_t kRows = 5;
  std::mt19937 rng(11);
  std::vector<uint8_t> in(static_cast<size_t>(kRows * kStride));
  for (size_t i = 0; i < in.size(); ++i) in[i] = static_cast<uint8_t>((i * 37 + rng() % 3) & 0xFF);
  for (const DType format : kFormats) {
    SCOPED_TRACE(dtype_name(format));
    const float sentinel = 12345.f;
    std::vector<float> f32(static_cast<size_t>(kRows * kWidth + 64), sentinel);
    std::vector<uint16_t> b16(static_cast<size_t>(kRows * kWidth + 64), uint16_t{0xABCD});
    cpu::fp8tab::rows_to_f32(format, in.data(), kStride, kRows, kWidth, f32.data());
    cpu::fp8tab::rows_to_bf16(format, in.data(), kStride, kRows, kWidth, b16.data());
    int mismatches = 0;
    for (int64_t r = 0; r < kRows; ++r) {
      for (int32_t e = 0; e < kWidth; ++e) {
        const uint8_t code = in[static_cast<size_t>(r * kStride + e)];
        const size_t at = static_cast<size_t>(r * kWidth + e);
        const uint32_t want = cpu::fp8tab::widened_bits(format, code);
        if (std::bit_cast<uint32_t>(f32[at]) != want || b16[at] != want >> 16) ++mismatches;
      }
    }
    EXPECT_EQ(mismatches, 0);
    for (size_t i = static_cast<size_t>(kRows * kWidth); i < f32.size(); ++i) {
      EXPECT_EQ(f32[i], sentinel) << "written past the rows at " << i;
      EXPECT_EQ(b16[i], 0xABCD) << "written past the rows at " << i;
    }
  }
}

// 32 V rows of codes, 576 bytes apart (a latent head's stride), byte i of the
// block (i * step + a little noise) mod 256 so that every code lands in every
// position somewhere; the rows `absent` says are null.
struct VCodes {
  static constexpr int64_t kStride = 576;
  static constexpr int kKeys = cpu::bf16::kPvKeys;
  std::vector<uint8_t> in = std::vector<uint8_t>(static_cast<size_t>(kKeys * kStride));
  const uint8_t* rows[kKeys];

  template <class Absent>
  VCodes(std::mt19937& rng, size_t step, uint32_t noise, const Absent& absent) {
    for (size_t i = 0; i < in.size(); ++i) in[i] = static_cast<uint8_t>((i * step + rng() % noise) & 0xFF);
    for (int j = 0; j < kKeys; ++j) rows[j] = absent(j) ? nullptr : in.data() + j * kStride;
  }
};

// V packed straight from codes: each packed word is its code's widened bf16
// at bf16::pack_v's place (two keys side by side per element, 16 elements a
// stretch), null rows zero; V of 128 and of 512 (latent) elements, rows 576
// bytes apart, every code in every position modulo 64 somewhere.
TEST_F(Fp8Tables, VPacksFromCodesToTheWidenedValuesInPairsOfKeys) {
  constexpr int kKeys = VCodes::kKeys;
  std::mt19937 rng(17);
  const VCodes codes(rng, 53, 5, [](int j) { return j % 7 == 3; });
  const auto& rows = codes.rows;
  for (const DType format : kFormats) {
    for (const int32_t dv : {128, 512}) {
      SCOPED_TRACE(::testing::Message() << dtype_name(format) << " dv " << dv);
      const size_t words = static_cast<size_t>(kKeys) * dv;
      std::vector<uint16_t> vb(words + 64, uint16_t{0xABCD});
      cpu::fp8tab::pack_v(format, rows, dv, vb.data());
      int mismatches = 0;
      for (int32_t t = 0; t < dv / 16; ++t) {
        for (int k = 0; k < kKeys / 2; ++k) {
          for (int e = 0; e < 16; ++e) {
            for (int i = 0; i < 2; ++i) {
              const uint8_t* row = rows[2 * k + i];
              const uint16_t want = row ? cpu::fp8tab::widened_bits(format, row[16 * t + e]) >> 16 : 0;
              const size_t at = static_cast<size_t>(t) * cpu::bf16::kValuesPerTile + 32 * k + 2 * e + i;
              if (vb[at] != want) ++mismatches;
            }
          }
        }
      }
      EXPECT_EQ(mismatches, 0);
      for (size_t i = words; i < vb.size(); ++i) EXPECT_EQ(vb[i], 0xABCD) << "written past the tiles at " << i;
    }
  }
}

// P.V of up to 4 rows widening V's codes in registers: the bits of V packed
// from the codes then multiplied (whose values the test above checks), from
// zero and from a running sum, null rows zero, rows 576 bytes apart, every
// code somewhere (NaN codes make NaN sums in both alike).
TEST_F(Fp8Tables, PvFromCodesInPlaceHasTheBitsOfPackedV) {
  if (!cpu::avx512_bf16_available()) GTEST_SKIP() << "this CPU offers no AVX512-BF16 (lscpu flag avx512_bf16)";
  constexpr int kKeys = VCodes::kKeys;
  constexpr int kRows = cpu::bf16dot::kInPlaceRows;
  std::mt19937 rng(29);
  const VCodes codes(rng, 97, 3, [](int j) { return j % 5 == 2; });
  const auto& rows = codes.rows;
  std::uniform_real_distribution<float> weight(0.f, 1.f);
  std::vector<float> p(static_cast<size_t>(cpu::bf16::kTileRows) * kKeys);
  for (float& x : p) x = weight(rng);
  const float* p_rows[cpu::bf16::kTileRows];
  int32_t begin[cpu::bf16::kTileRows], end[cpu::bf16::kTileRows];
  for (int r = 0; r < cpu::bf16::kTileRows; ++r) {
    p_rows[r] = p.data() + r * kKeys;
    begin[r] = 5 * r;
    end[r] = kKeys - 2 * r;
  }
  for (const DType format : kFormats) {
    for (const int32_t dv : {64, 128, 512}) {
      std::vector<uint16_t> vb(static_cast<size_t>(kKeys) * dv);
      cpu::fp8tab::pack_v(format, rows, dv, vb.data());
      std::vector<float> start(static_cast<size_t>(kRows) * dv);
      for (float& x : start) x = weight(rng) - 0.5f;
      for (int32_t n = 1; n <= kRows; ++n) {
        for (const bool first : {true, false}) {
          SCOPED_TRACE(::testing::Message() << dtype_name(format) << " dv " << dv << ", rows " << n
                                            << (first ? ", first" : ""));
          alignas(64) uint16_t pa[cpu::bf16::kTileRows * kKeys];
          cpu::bf16::pack_p(p_rows, begin, end, n, pa);
          std::vector<float> packed = start;
          cpu::bf16dot::accumulate(pa, vb.data(), dv, packed.data(), dv, n, first);
          std::vector<float> in_place = start;
          cpu::fp8tab::accumulate_in_place(format, pa, rows, dv, in_place.data(), dv, n, first);
          ASSERT_EQ(std::memcmp(in_place.data(), packed.data(), static_cast<size_t>(n * dv) * sizeof(float)), 0);
        }
      }
    }
  }
}

// K packed pair by pair from codes: each word is its code's widened bf16 at
// pack_k's place, rows past n zero; the scores read from it have the bits of
// the scores read from the same keys widened as rows (whose error the unit
// tests bound against a double reference), 1 to 16 rows, one and two groups,
// nothing written past each group's keys.
TEST_F(Fp8Tables, ScoresFromKeysPackedPairByPairHaveTheBitsOfKeysWidenedAsRows) {
  if (!cpu::avx512_bf16_available()) GTEST_SKIP() << "this CPU offers no AVX512-BF16 (lscpu flag avx512_bf16)";
  using cpu::bf16::kTileRows;
  std::mt19937 rng(23);
  std::normal_distribution<float> normal(0.f, 1.f);
  for (const DType format : kFormats) {
    for (const int32_t d : {64, 128, 576}) {
      SCOPED_TRACE(::testing::Message() << dtype_name(format) << " d " << d);
      const int64_t stride = d + 64;
      const int32_t n[2] = {16, 11};
      std::vector<uint8_t> codes(static_cast<size_t>(2 * kTileRows * stride));
      for (uint8_t& c : codes) c = static_cast<uint8_t>(rng() & 0xFF);
      for (size_t i = 0; i < codes.size(); ++i) {
        if ((codes[i] & 0x7F) == 0x7F) codes[i] = 0x11;  // no NaN codes: compared bit for bit below
      }
      std::vector<uint16_t> kb(static_cast<size_t>(2 * kTileRows * d));
      std::vector<uint16_t> rows_bf16(static_cast<size_t>(2 * kTileRows * d), 0);
      for (int g = 0; g < 2; ++g) {
        const uint8_t* group = codes.data() + g * kTileRows * stride;
        cpu::fp8tab::pack_k(format, group, stride, n[g], d, kb.data() + g * kTileRows * d);
        cpu::fp8tab::rows_to_bf16(format, group, stride, n[g], d, rows_bf16.data() + g * kTileRows * d);
        int mismatches = 0;
        for (int32_t p = 0; p < d / 2; ++p) {
          for (int j = 0; j < kTileRows; ++j) {
            for (int i = 0; i < 2; ++i) {
              const uint16_t want =
                  j < n[g] ? cpu::fp8tab::widened_bits(format, group[j * stride + 2 * p + i]) >> 16 : 0;
              if (kb[static_cast<size_t>(g * kTileRows * d + 32 * p + 2 * j + i)] != want) ++mismatches;
            }
          }
        }
        EXPECT_EQ(mismatches, 0) << "group " << g;
      }
      std::vector<float> q(static_cast<size_t>(kTileRows) * d);
      for (float& x : q) x = normal(rng);
      const cpu::bf16::KeyRows keys[2] = {{rows_bf16.data(), 2 * d, n[0]},
                                          {rows_bf16.data() + kTileRows * d, 2 * d, n[1]}};
      const cpu::bf16::KeyRows packed_keys[2] = {{kb.data(), 2 * d, n[0]}, {kb.data() + kTileRows * d, 2 * d, n[1]}};
      for (const int32_t rows : {1, 3, 4, 5, 8, 13, 16}) {
        for (const int32_t groups : {1, 2}) {
          SCOPED_TRACE(::testing::Message() << "rows " << rows << ", groups " << groups);
          const float* q_rows[kTileRows] = {};
          for (int r = 0; r < rows; ++r) q_rows[r] = q.data() + r * d;
          std::vector<uint16_t> qb(static_cast<size_t>(kTileRows) * d);
          cpu::bf16::pack_q(q_rows, d, qb.data());
          constexpr int64_t out_stride = 40;
          constexpr float kUntouched = -12345.f;
          std::vector<float> packed(static_cast<size_t>(kTileRows) * out_stride, kUntouched);
          std::vector<float> as_rows = packed;
          cpu::bf16dot::scores_packed(qb.data(), d, packed_keys, groups, rows, 0.125f, packed.data(), out_stride);
          cpu::bf16dot::scores(qb.data(), d, keys, groups, rows, 0.125f, as_rows.data(), out_stride);
          for (int r = 0; r < kTileRows; ++r) {
            for (int j = 0; j < out_stride; ++j) {
              const size_t i = static_cast<size_t>(r * out_stride + j);
              const bool live = r < rows && (j < n[0] || (groups == 2 && j < 16 + n[1]));
              if (!live) {
                ASSERT_EQ(packed[i], kUntouched) << "row " << r << " key " << j << " is not one to write";
                continue;
              }
              ASSERT_EQ(std::memcmp(&packed[i], &as_rows[i], sizeof(float)), 0)
                  << "row " << r << " key " << j << ": " << packed[i] << " against " << as_rows[i];
            }
          }
        }
      }
    }
  }
}

// The kernel with and without the tables on one cache: tiles (four query rows
// per sequence) and in-place reads (one), both formats, a NaN in one token's
// V (one output element of its head's rows turns NaN) and in another's K, so
// that runs with a NaN code take the tile. The values read are the same, so
// are the bits.
TEST_F(Fp8Tables, TheKernelGivesTheSameBitsWithAndWithoutTables) {
  for (const DType format : kFormats) {
    SCOPED_TRACE(dtype_name(format));
    CacheGeometry g;
    g.num_layers = 1;
    g.num_kv_heads = 2;
    g.num_q_heads = 8;
    g.head_dim = 128;
    g.block_size = 16;
    g.dtype = format;
    g.num_blocks = 64;
    FixtureOptions o;
    o.geometry = g;
    o.seed = 5;
    CacheFixture f(o);
    const std::vector<SequenceId> ids = f.add_sequences(0, {40, 300, 7});
    const size_t row = static_cast<size_t>(g.num_kv_heads) * g.head_dim;
    std::normal_distribution<float> normal(0.f, 1.f);
    std::vector<float> k(row), v(row);
    for (size_t i = 0; i < row; ++i) {
      k[i] = normal(f.rng());
      v[i] = normal(f.rng());
    }
    std::vector<float> v_nan = v;
    v_nan[3] = std::numeric_limits<float>::quiet_NaN();  // kv head 0, element 3
    std::vector<float> k_nan = k;
    k_nan[static_cast<size_t>(g.head_dim)] = std::numeric_limits<float>::quiet_NaN();  // kv head 1
    f.append_rows(ids[0], 0, 1, k, v_nan);
    f.append_random(ids[0], 0, 7);
    f.append_rows(ids[2], 0, 1, k_nan, v);
    const int32_t heads = g.num_q_heads;
    const auto element = [&](const std::vector<float>& out, int32_t r, int32_t h, int32_t e) {
      return out[(static_cast<size_t>(r) * heads + h) * g.head_dim + e];
    };
    for (const int32_t q_len : {1, 4}) {
      SCOPED_TRACE(q_len);
      CacheFixture::Variant rows;
      rows.q_lengths.assign(ids.size(), q_len);
      const CacheFixture::Queries q = f.random_queries(static_cast<int32_t>(ids.size()) * q_len, DType::kFloat32);
      cpu::use_fp8_tables(true);
      ASSERT_TRUE(cpu::fp8_tables_serve(g));
      const auto with = f.decode(0, ids, q, 0.f, SplitMode::kDeterministic, 64, rows);
      cpu::use_fp8_tables(false);
      ASSERT_FALSE(cpu::fp8_tables_serve(g));
      const auto without = f.decode(0, ids, q, 0.f, SplitMode::kDeterministic, 64, rows);
      ASSERT_EQ(with.out.size(), without.out.size());
      EXPECT_EQ(std::memcmp(with.out.data(), without.out.data(), with.out.size() * sizeof(float)), 0);
      EXPECT_EQ(std::memcmp(with.lse.data(), without.lse.data(), with.lse.size() * sizeof(float)), 0);
      for (int32_t i = 0; i < q_len; ++i) {
        EXPECT_TRUE(std::isnan(element(with.out, i, 0, 3))) << "V's NaN reaches its element";
        EXPECT_FALSE(std::isnan(element(with.out, i, 0, 4))) << "and no other";
        const int32_t c = 2 * q_len + i;  // the third sequence's rows
        EXPECT_FALSE(std::isnan(element(with.out, c, 0, 0))) << "K's NaN stays in its own head";
      }
    }
  }
}

TEST_F(Fp8Tables, TheKernelNameSaysVbmiForFp8CachesOnAvx3Only) {
  CacheGeometry g;
  g.num_kv_heads = 2;
  g.num_q_heads = 8;
  g.dtype = DType::kFloat8E4M3;
  CacheGeometry fp16 = g;
  fp16.dtype = DType::kFloat16;
  ASSERT_TRUE(cpu::select_simd_target("avx3").ok());
  EXPECT_EQ(cpu::kernel_target_name(g), "AVX3+VBMI");
  EXPECT_EQ(cpu::kernel_target_name(fp16), "AVX3");
  cpu::use_fp8_tables(false);
  EXPECT_EQ(cpu::kernel_target_name(g), "AVX3");
  cpu::use_fp8_tables(true);
  ASSERT_TRUE(cpu::select_simd_target("avx2").ok());
  EXPECT_FALSE(cpu::fp8_tables_serve(g)) << "an AVX2 selection runs no AVX-512 instruction";
  EXPECT_EQ(cpu::kernel_target_name(g), "AVX2");
}

}  // namespace
}  // namespace pagoda::testing
