// The AMX path of bf16 caches (kernels/cpu/amx_tiles.h): its tile functions
// against double sums of the same bf16 inputs, its decodes against the fp64
// reference within the bound derived in decode_table.h, and its selection.
// Skipped, with the reason, where the CPU or its kernel has no AMX.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "cpu/amx_tiles.h"
#include "pagoda/backend.h"
#include "pagoda/cpu_targets.h"
#include "pagoda/host_convert.h"
#include "reference/decode_table.h"
#include "unit/cache_fixture.h"

namespace pagoda::testing {
namespace {

using cpu::amx::kPvKeys;
using cpu::amx::kTileRows;

double bf16_value(uint16_t bits) { return static_cast<double>(bf16_to_float(bits)); }
double rounded(float x) { return bf16_value(float_to_bf16(x)); }
// The classic bound on an fp32 sum of n exact terms: gamma(n) times the sum of |terms|.
double gamma_bound(int n) { return n * 0x1p-24 / (1 - n * 0x1p-24); }

class Amx : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!cpu::amx_available()) {
      GTEST_SKIP() << "this CPU or its kernel offers no AMX-BF16 (lscpu flags amx_bf16 and amx_tile, Linux 5.16 or "
                      "later granting the tile data): the bf16 cache runs the AVX-512/AVX2 FMA path here";
    }
  }
  void TearDown() override { EXPECT_TRUE(cpu::select_simd_target("best").ok()); }
  std::mt19937 rng_{2024};
};

TEST_F(Amx, ScoresAreFp32SumsOfTheRoundedProductsForTheLiveRowsAndKeysOnly) {
  constexpr int32_t d = 128;
  constexpr int32_t rows = 5;
  constexpr float scale = 0.3f;
  std::normal_distribution<float> normal(0.f, 1.f);
  std::vector<float> q(static_cast<size_t>(rows) * d);
  for (float& x : q) x = normal(rng_);
  // Two groups: 16 keys in place with a row stride wider than d, then 7 keys
  // beside 9 zero rows.
  constexpr int64_t stride = d + 32;
  std::vector<uint16_t> k0(16 * stride), k1(16 * d, 0);
  for (uint16_t& x : k0) x = float_to_bf16(normal(rng_));
  for (int j = 0; j < 7 * d; ++j) k1[static_cast<size_t>(j)] = float_to_bf16(normal(rng_));
  const float* q_rows[kTileRows] = {};
  for (int r = 0; r < rows; ++r) q_rows[r] = q.data() + r * d;
  std::vector<uint16_t> qb(static_cast<size_t>(kTileRows) * d);
  cpu::amx::pack_q(q_rows, d, qb.data());
  const cpu::amx::KeyRows keys[2] = {{k0.data(), stride * 2, 16}, {k1.data(), d * 2, 7}};
  constexpr int64_t out_stride = 40;
  constexpr float kUntouched = -12345.f;
  std::vector<float> out(static_cast<size_t>(kTileRows) * out_stride, kUntouched);
  {
    const cpu::amx::TileScope tiles;
    cpu::amx::scores(qb.data(), d, keys, 2, rows, scale, out.data(), out_stride);
  }
  for (int r = 0; r < kTileRows; ++r) {
    for (int j = 0; j < out_stride; ++j) {
      const float got = out[static_cast<size_t>(r * out_stride + j)];
      if (r >= rows || j >= 16 + 7) {
        ASSERT_EQ(got, kUntouched) << "row " << r << " key " << j << " is not one to write";
        continue;
      }
      const uint16_t* k = j < 16 ? k0.data() + j * stride : k1.data() + (j - 16) * d;
      double want = 0, magnitude = 0;
      for (int e = 0; e < d; ++e) {
        const double term = rounded(q[static_cast<size_t>(r * d + e)]) * bf16_value(k[e]);
        want += term;
        magnitude += std::abs(term);
      }
      ASSERT_NEAR(got, scale * want, gamma_bound(d + 1) * scale * magnitude) << "row " << r << " key " << j;
    }
  }
}

TEST_F(Amx, PvAddsRoundedWeightsInsideEachRowsRangeAndZerosElsewhere) {
  for (const int32_t dv : {128, 512}) {
    SCOPED_TRACE("dv " + std::to_string(dv));
    std::uniform_real_distribution<float> unit(-1.f, 1.f);
    std::uniform_real_distribution<float> weight(0.f, 1.f);
    // 32 V rows, two of them absent (zero rows), 20 wide.
    std::vector<std::vector<uint16_t>> v(kPvKeys, std::vector<uint16_t>(static_cast<size_t>(dv)));
    const uint16_t* v_rows[kPvKeys];
    for (int j = 0; j < kPvKeys; ++j) {
      for (uint16_t& x : v[static_cast<size_t>(j)]) x = float_to_bf16(unit(rng_));
      v_rows[j] = (j == 3 || j == 30) ? nullptr : v[static_cast<size_t>(j)].data();
    }
    std::vector<uint16_t> vb(static_cast<size_t>(kPvKeys) * dv);
    cpu::amx::pack_v(v_rows, dv, vb.data());
    constexpr int32_t rows = 4;
    const int32_t begin[kTileRows] = {0, 5, 31, 9};
    const int32_t end[kTileRows] = {32, 17, 32, 9};  // the last row has no key here
    std::vector<float> p(static_cast<size_t>(rows) * kPvKeys);
    for (float& x : p) x = weight(rng_);
    const float* p_rows[kTileRows] = {};
    for (int r = 0; r < rows; ++r) p_rows[r] = p.data() + r * kPvKeys;
    alignas(64) uint16_t pa[kTileRows * kPvKeys];
    cpu::amx::pack_p(p_rows, begin, end, rows, pa);
    std::vector<float> acc(static_cast<size_t>(kTileRows) * dv);
    for (float& x : acc) x = unit(rng_);
    const std::vector<float> before = acc;
    {
      const cpu::amx::TileScope tiles;
      cpu::amx::accumulate(pa, vb.data(), dv, acc.data(), dv);
    }
    for (int r = 0; r < kTileRows; ++r) {
      for (int e = 0; e < dv; ++e) {
        const size_t i = static_cast<size_t>(r * dv + e);
        if (r >= rows || begin[r] >= end[r]) {
          ASSERT_EQ(std::memcmp(&acc[i], &before[i], sizeof(float)), 0) << "row " << r << " gained a nonzero";
          continue;
        }
        double want = before[i], magnitude = std::abs(before[i]);
        for (int j = begin[r]; j < end[r]; ++j) {
          if (v_rows[j] == nullptr) continue;
          const double term = rounded(p[static_cast<size_t>(r * kPvKeys + j)]) * bf16_value(v_rows[j][e]);
          want += term;
          magnitude += std::abs(term);
        }
        ASSERT_NEAR(acc[i], want, gamma_bound(kPvKeys + 1) * magnitude) << "row " << r << " element " << e;
      }
    }
  }
}

TEST_F(Amx, BestServesBf16CachesFromGqa8AmxEveryOneAndAvx3None) {
  CacheGeometry g;
  g.num_kv_heads = 2;
  g.num_q_heads = 16;
  g.dtype = DType::kBFloat16;
  CacheGeometry gqa4 = g;
  gqa4.num_q_heads = 8;
  CacheGeometry fp16 = g;
  fp16.dtype = DType::kFloat16;
  ASSERT_TRUE(cpu::select_simd_target("best").ok());
  EXPECT_TRUE(cpu::amx_serves(g));
  EXPECT_EQ(cpu::kernel_target_name(g), "AVX3+AMX-BF16");
  EXPECT_FALSE(cpu::amx_serves(gqa4)) << "four rows per position leave a 16-row tile mostly idle";
  EXPECT_EQ(cpu::kernel_target_name(gqa4), "AVX3");
  EXPECT_FALSE(cpu::amx_serves(fp16)) << "fp16 would lose 3 bits in bf16 tiles";
  for (const DType fp8 : {DType::kFloat8E4M3, DType::kFloat8E5M2}) {
    CacheGeometry f = g;
    f.dtype = fp8;
    EXPECT_TRUE(cpu::amx_serves(f)) << "fp8 widens to bf16 exactly";
  }
  ASSERT_TRUE(cpu::select_simd_target("amx").ok());
  EXPECT_TRUE(cpu::amx_serves(g));
  EXPECT_TRUE(cpu::amx_serves(gqa4));
  EXPECT_FALSE(cpu::amx_serves(fp16));
  ASSERT_TRUE(cpu::select_simd_target("avx3").ok());
  EXPECT_FALSE(cpu::amx_serves(g));
  EXPECT_EQ(cpu::kernel_target_name(g), "AVX3");
  ASSERT_TRUE(cpu::select_simd_target("avx2").ok());
  EXPECT_FALSE(cpu::amx_serves(g));
}

// GetConfig's device_name is the backend's: it says which kernel decodes.
TEST_F(Amx, TheBackendsDeviceNameSaysTheTilesServe) {
  BackendOptions o;
  o.kind = "cpu";
  o.cpu_threads = 1;
  o.geometry.num_layers = 1;
  o.geometry.num_kv_heads = 1;
  o.geometry.num_q_heads = 8;
  o.geometry.head_dim = 128;
  o.geometry.dtype = DType::kBFloat16;
  o.geometry.num_blocks = 4;
  auto tiles = make_backend(o);
  ASSERT_TRUE(tiles.ok()) << tiles.status().message();
  EXPECT_NE((*tiles)->device_name().find("(AVX3+AMX-BF16, 1 threads)"), std::string::npos) << (*tiles)->device_name();
  o.cpu_target = "avx3";
  auto fmas = make_backend(o);
  ASSERT_TRUE(fmas.ok()) << fmas.status().message();
  EXPECT_NE((*fmas)->device_name().find("(AVX3, 1 threads)"), std::string::npos) << (*fmas)->device_name();
}

// Both paths of one bf16 cache, multi-token rows with a window: each within
// its own bound of the reference, and different bits (the tiles did run).
TEST_F(Amx, TilesAndFmasEachMatchTheReferenceOnOneBf16Cache) {
  CacheGeometry g;
  g.num_layers = 1;
  g.num_kv_heads = 2;
  g.num_q_heads = 16;
  g.head_dim = 128;
  g.block_size = 16;
  g.dtype = DType::kBFloat16;
  g.num_blocks = 260;
  CacheFixture f({g, 2, 4242});
  const std::vector<SequenceId> ids = {f.add_sequence(0, 1500), f.add_sequence(0, 37), f.add_sequence(0, 2000)};
  CacheFixture::Variant v;
  v.q_lengths = {4, 4, 4};
  v.window = 700;
  const auto q = f.random_queries(12, DType::kFloat32);
  const float scale = 1.f / std::sqrt(128.f);
  std::vector<std::vector<float>> outs;
  for (const std::string target : {"amx", "avx3"}) {
    SCOPED_TRACE(target);
    ASSERT_TRUE(cpu::select_simd_target(target).ok());
    const Arithmetic arithmetic = arithmetic_of("cpu", g);
    EXPECT_EQ(arithmetic, target == "amx" ? Arithmetic::kBf16Tiles : Arithmetic::kFp32);
    const auto got = f.decode(0, ids, q, scale, SplitMode::kDeterministic, 512, v);
    const auto want = f.reference(0, ids, as_multiplied(q, arithmetic), scale, v);
    expect_matches_reference(got.out, got.lse, want, DType::kFloat32, arithmetic);
    outs.push_back(got.out);
  }
  EXPECT_NE(outs[0], outs[1]) << "the amx and avx3 targets gave the same bits: one path ran twice";
}

TEST(AmxSelection, TheAmxTargetIsThereExactlyWhenTheCpuHasIt) {
  const Status s = cpu::select_simd_target("amx");
  if (cpu::amx_available()) {
    EXPECT_TRUE(s.ok()) << s.message();
  } else {
    EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition);
    EXPECT_NE(s.message().find("AMX-BF16"), std::string::npos) << s.message();
  }
  EXPECT_TRUE(cpu::select_simd_target("best").ok());
}

}  // namespace
}  // namespace pagoda::testing
