// The matrix-unit paths of bf16 (and fp8) caches, AMX tiles and AVX512-BF16
// dot products: their decodes against the fp64 reference within the bound
// derived in decode_table.h, their selection and the device name that reports
// them (the units' functions: bf16_units_test.cc). Each unit is skipped, with
// the reason, where the CPU or its kernel lacks it.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "cpu/dot_groups.h"
#include "pagoda/backend.h"
#include "pagoda/cpu_targets.h"
#include "reference/decode_table.h"
#include "unit/cache_fixture.h"

namespace pagoda::testing {
namespace {

struct UnitCase {
  const char* target;  // select_simd_target's name of the unit
  cpu::MatrixUnit unit;
  const char* suffix;  // kernel_target_name's addition
  bool (*available)();
  const char* missing;
  int32_t best_min_group_bf16;  // the smallest group best gives the unit, bf16 (fp8: DotGroups below)
};

const UnitCase kUnits[] = {
    {"amx", cpu::MatrixUnit::kAmx, "+AMX-BF16", &cpu::amx_available,
     "this CPU or its kernel offers no AMX-BF16 (lscpu flags amx_bf16 and amx_tile, Linux 5.16 or later granting the "
     "tile data)",
     8},
    {"avx512bf16", cpu::MatrixUnit::kAvx512Bf16, "+AVX512-BF16", &cpu::avx512_bf16_available,
     "this CPU offers no AVX512-BF16 (lscpu flag avx512_bf16)", 4},
};

// Where the CPU has AMX, best takes it; the dot products only without it.
bool best_takes(const UnitCase& u) { return u.unit == cpu::MatrixUnit::kAmx || !cpu::amx_available(); }

class MatrixUnit : public ::testing::TestWithParam<UnitCase> {
 protected:
  void SetUp() override {
    if (!GetParam().available()) GTEST_SKIP() << GetParam().missing << ": the bf16 cache runs the FMA path here";
  }
  void TearDown() override { EXPECT_TRUE(cpu::select_simd_target("best").ok()); }
};

TEST_P(MatrixUnit, BestServesWideGroupsTheUnitEveryOneAndAvx3None) {
  const UnitCase& u = GetParam();
  CacheGeometry g;
  g.num_kv_heads = 2;
  g.num_q_heads = 16;
  g.dtype = DType::kBFloat16;
  CacheGeometry gqa4 = g;
  gqa4.num_q_heads = 8;
  CacheGeometry gqa2 = g;
  gqa2.num_q_heads = 4;
  CacheGeometry fp8_gqa4 = gqa4;
  fp8_gqa4.dtype = DType::kFloat8E4M3;
  CacheGeometry fp16 = g;
  fp16.dtype = DType::kFloat16;
  ASSERT_TRUE(cpu::select_simd_target("best").ok());
  if (best_takes(u)) {
    EXPECT_EQ(cpu::matrix_unit_for(g), u.unit);
    EXPECT_EQ(cpu::kernel_target_name(g), std::string("AVX3") + u.suffix);
    EXPECT_EQ(cpu::matrix_unit_for(gqa4), u.best_min_group_bf16 <= 4 ? u.unit : cpu::MatrixUnit::kNone);
  }
  EXPECT_EQ(cpu::matrix_unit_for(gqa2), cpu::MatrixUnit::kNone) << "two rows per position leave a block mostly idle";
  EXPECT_EQ(cpu::kernel_target_name(gqa2), "AVX3");
  // fp8 at GQA 4 takes the dot products where they measured faster (Zen 5;
  // e5m2 from head_dim 128), else the FMAs.
  const bool dots_serve_best = best_takes(u) && u.unit == cpu::MatrixUnit::kAvx512Bf16;
  const auto on_dots_under_best = [&](const CacheGeometry& f) {
    return dots_serve_best && cpu::dot_min_group(f.dtype, f.head_dim, cpu::this_cpu_family()) <= 4;
  };
  EXPECT_EQ(cpu::matrix_unit_for(fp8_gqa4), on_dots_under_best(fp8_gqa4) ? u.unit : cpu::MatrixUnit::kNone);
  CacheGeometry e5m2_gqa4 = gqa4;
  e5m2_gqa4.dtype = DType::kFloat8E5M2;
  for (const int32_t head_dim : {64, 128}) {
    e5m2_gqa4.head_dim = head_dim;
    EXPECT_EQ(cpu::matrix_unit_for(e5m2_gqa4), on_dots_under_best(e5m2_gqa4) ? u.unit : cpu::MatrixUnit::kNone)
        << "e5m2, head_dim " << head_dim;
  }
  EXPECT_EQ(cpu::matrix_unit_for(fp16), cpu::MatrixUnit::kNone) << "fp16 would lose 3 bits in bf16";
  ASSERT_TRUE(cpu::select_simd_target(u.target).ok());
  EXPECT_EQ(cpu::matrix_unit_for(g), u.unit);
  EXPECT_EQ(cpu::matrix_unit_for(gqa4), u.unit);
  EXPECT_TRUE(cpu::bf16_unit_serves(gqa4));
  EXPECT_EQ(cpu::amx_serves(gqa4), u.unit == cpu::MatrixUnit::kAmx);
  EXPECT_EQ(cpu::matrix_unit_for(fp16), cpu::MatrixUnit::kNone);
  for (const DType fp8 : {DType::kFloat8E4M3, DType::kFloat8E5M2}) {
    CacheGeometry f = g;
    f.dtype = fp8;
    EXPECT_EQ(cpu::matrix_unit_for(f), u.unit) << "fp8 widens to bf16 exactly";
  }
  ASSERT_TRUE(cpu::select_simd_target("avx3").ok());
  EXPECT_EQ(cpu::matrix_unit_for(g), cpu::MatrixUnit::kNone);
  EXPECT_EQ(cpu::kernel_target_name(g), "AVX3");
  ASSERT_TRUE(cpu::select_simd_target("avx2").ok());
  EXPECT_EQ(cpu::matrix_unit_for(g), cpu::MatrixUnit::kNone);
}

// The groups "best" gives the dot products, per dtype, head_dim and CPU
// family: bf16 from 4 everywhere, fp8 from 8, but on AMD Zen 5 and later e4m3
// from 4, and e5m2 from 4 from head_dim 128.
TEST(DotGroups, Bf16From4FpEightFrom8AndFrom4OnZen5) {
  const cpu::CpuFamily zen4{true, 0x19}, zen5{true, 0x1A}, zen6{true, 0x1B}, intel{false, 6};
  for (const cpu::CpuFamily cpu : {zen4, zen5, zen6, intel}) {
    const bool zen5_on = cpu.amd && cpu.family >= 0x1A;
    for (const int32_t head_dim : {64, 128, 256}) {
      SCOPED_TRACE("amd " + std::to_string(cpu.amd) + ", family " + std::to_string(cpu.family) + ", head_dim " +
                   std::to_string(head_dim));
      EXPECT_EQ(cpu::dot_min_group(DType::kBFloat16, head_dim, cpu), 4);
      EXPECT_EQ(cpu::dot_min_group(DType::kFloat8E4M3, head_dim, cpu), zen5_on ? 4 : 8);
      EXPECT_EQ(cpu::dot_min_group(DType::kFloat8E5M2, head_dim, cpu), zen5_on && head_dim >= 128 ? 4 : 8);
    }
  }
}

// GetConfig's device_name is the backend's: it says which kernel decodes.
TEST_P(MatrixUnit, TheBackendsDeviceNameSaysTheUnitServes) {
  const UnitCase& u = GetParam();
  BackendOptions o;
  o.kind = "cpu";
  o.cpu_threads = 1;
  o.cpu_target = u.target;
  o.geometry.num_layers = 1;
  o.geometry.num_kv_heads = 1;
  o.geometry.num_q_heads = 8;
  o.geometry.head_dim = 128;
  o.geometry.dtype = DType::kBFloat16;
  o.geometry.num_blocks = 4;
  auto unit = make_backend(o);
  ASSERT_TRUE(unit.ok()) << unit.status().message();
  const std::string want = std::string("(AVX3") + u.suffix + ", 1 threads)";
  EXPECT_NE((*unit)->device_name().find(want), std::string::npos) << (*unit)->device_name();
  o.cpu_target = "avx3";
  auto fmas = make_backend(o);
  ASSERT_TRUE(fmas.ok()) << fmas.status().message();
  EXPECT_NE((*fmas)->device_name().find("(AVX3, 1 threads)"), std::string::npos) << (*fmas)->device_name();
}

// Both paths of one bf16 cache, multi-token rows with a window: each within
// its own bound of the reference, and different bits (the unit did run).
TEST_P(MatrixUnit, UnitAndFmasEachMatchTheReferenceOnOneBf16Cache) {
  const UnitCase& u = GetParam();
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
  for (const std::string& target : {std::string(u.target), std::string("avx3")}) {
    SCOPED_TRACE(target);
    ASSERT_TRUE(cpu::select_simd_target(target).ok());
    const Arithmetic arithmetic = arithmetic_of("cpu", g);
    EXPECT_EQ(arithmetic, target == u.target ? Arithmetic::kBf16Tiles : Arithmetic::kFp32);
    const auto got = f.decode(0, ids, q, scale, SplitMode::kDeterministic, 512, v);
    const auto want = f.reference(0, ids, as_multiplied(q, arithmetic), scale, v);
    expect_matches_reference(got.out, got.lse, want, DType::kFloat32, arithmetic);
    outs.push_back(got.out);
  }
  EXPECT_NE(outs[0], outs[1]) << "the " << u.target << " and avx3 targets gave the same bits: one path ran twice";
}

INSTANTIATE_TEST_SUITE_P(Units, MatrixUnit, ::testing::ValuesIn(kUnits),
                         [](const ::testing::TestParamInfo<UnitCase>& i) {
                           return std::string(i.param.unit == cpu::MatrixUnit::kAmx ? "Amx" : "Avx512Bf16");
                         });

TEST(MatrixUnitSelection, EachUnitsTargetIsThereExactlyWhenTheCpuHasIt) {
  for (const UnitCase& u : kUnits) {
    SCOPED_TRACE(u.target);
    const Status s = cpu::select_simd_target(u.target);
    if (u.available()) {
      EXPECT_TRUE(s.ok()) << s.message();
    } else {
      EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition);
      EXPECT_NE(s.message().find(u.suffix + 1), std::string::npos) << s.message();
    }
  }
  EXPECT_TRUE(cpu::select_simd_target("best").ok());
}

}  // namespace
}  // namespace pagoda::testing
