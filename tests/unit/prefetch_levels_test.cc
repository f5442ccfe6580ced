// Where the CPU kernel's tasks request their lines: the per-family "auto"
// levels, the selection by name (a bad one refused, changing nothing), and
// that the level changes no bit of a decode on any path.
#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

#include "cpu/prefetch_levels.h"
#include "pagoda/cpu_targets.h"
#include "unit/cache_fixture.h"

namespace pagoda::cpu {
namespace {

class PrefetchLevelsTest : public ::testing::Test {
 protected:
  void TearDown() override { EXPECT_TRUE(select_prefetch_level("auto").ok()); }
};

TEST_F(PrefetchLevelsTest, AutoIsL1OnZen5AndMemoryBoundTasksToL2Elsewhere) {
  EXPECT_EQ(auto_prefetch_levels({true, 0x1A}), kAllL1);
  EXPECT_EQ(auto_prefetch_levels({true, 0x1B}), kAllL1) << "families after Zen 5 keep its levels";
  const PrefetchLevels split = auto_prefetch_levels({true, 0x19});
  EXPECT_EQ(auto_prefetch_levels({false, 6}), split) << "Intel keeps the Zen 4 levels";
  EXPECT_EQ(split.fma(1), PrefetchLevel::kL2);
  EXPECT_EQ(split.fma(kFewPrefetchRows), PrefetchLevel::kL2);
  EXPECT_EQ(split.fma(kFewPrefetchRows + 1), PrefetchLevel::kL1);
  EXPECT_EQ(split.bf16_dot, PrefetchLevel::kL2);
  EXPECT_EQ(split.amx, PrefetchLevel::kL1);
  EXPECT_EQ(describe(split), "L2 (FMA to 8 rows, dot products), L1 (wider FMA, tiles)");
}

TEST_F(PrefetchLevelsTest, DistanceOnZen5Is48RowsButForWideMatrixUnitTasksAnd32Elsewhere) {
  const PrefetchDistance zen5 = auto_prefetch_distance({true, 0x1A});
  EXPECT_EQ(zen5.rows(1), 48);
  EXPECT_EQ(zen5.rows(kFewPrefetchRows), 48);
  EXPECT_EQ(zen5.rows(kFewPrefetchRows + 1), 48) << "wider FMA tasks";
  EXPECT_EQ(zen5.unit_rows(1), 48);
  EXPECT_EQ(zen5.unit_rows(kFewPrefetchRows), 48);
  EXPECT_EQ(zen5.unit_rows(kFewPrefetchRows + 1), 32) << "wider matrix-unit tasks";
  EXPECT_EQ(auto_prefetch_distance({true, 0x1B}), zen5) << "families after Zen 5 keep its distance";
  for (const CpuFamily other : {CpuFamily{true, 0x19}, CpuFamily{false, 6}, CpuFamily{}}) {
    const PrefetchDistance d = auto_prefetch_distance(other);
    EXPECT_EQ(d, PrefetchDistance{});
    for (const int32_t rows : {1, kFewPrefetchRows, kFewPrefetchRows + 1, 128}) {
      EXPECT_EQ(d.rows(rows), 32);
      EXPECT_EQ(d.unit_rows(rows), 32);
    }
  }
  EXPECT_EQ(describe(zen5), "48 rows ahead (tasks of up to 8 rows, wider FMA tasks), 32 (wider matrix-unit tasks)");
  EXPECT_EQ(describe(PrefetchDistance{}), "32 rows ahead");
  EXPECT_EQ(describe(PrefetchDistance{48, 32, 32}), "48 rows ahead (tasks of up to 8 rows), 32 (wider FMA tasks, "
                                                    "wider matrix-unit tasks)");
  EXPECT_EQ(describe(PrefetchDistance{32, 64, 32}), "32 rows ahead (tasks of up to 8 rows, wider matrix-unit "
                                                    "tasks), 64 (wider FMA tasks)");
  EXPECT_EQ(prefetch_distance(), auto_prefetch_distance(this_cpu_family()));
  EXPECT_EQ(prefetch_distance_name(), describe(prefetch_distance()));
}

TEST_F(PrefetchLevelsTest, SelectionByNameAndARefusalChangesNothing) {
  ASSERT_TRUE(select_prefetch_level("l2").ok());
  EXPECT_EQ(prefetch_levels(), kAllL2);
  EXPECT_EQ(prefetch_level_name(), "L2");
  ASSERT_TRUE(select_prefetch_level("l1").ok());
  EXPECT_EQ(prefetch_levels(), kAllL1);
  EXPECT_EQ(prefetch_level_name(), "L1");
  const Status s = select_prefetch_level("L3");
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(s.message(), "prefetch: expected auto, l1 or l2, received 'L3'");
  EXPECT_EQ(prefetch_levels(), kAllL1) << "a refused selection leaves the levels as they were";
  ASSERT_TRUE(select_prefetch_level("auto").ok());
  EXPECT_EQ(prefetch_levels(), auto_prefetch_levels(this_cpu_family()));
}

// One row per position and a group of 4 (4 rows: few) and four positions (16
// rows: many), fp16 on the FMAs and bf16 on whatever best gives it (the dot
// products where the CPU has them): the same bits under either level.
TEST_F(PrefetchLevelsTest, TheLevelChangesNoBitOfADecode) {
  constexpr float kScale = 0.125f;
  for (const DType dtype : {DType::kFloat16, DType::kBFloat16}) {
    SCOPED_TRACE(dtype_name(dtype));
    const CacheGeometry g = testing::table_geometry({128, 4, 16, dtype, DType::kFloat32});
    testing::FixtureOptions o(g, 2, 11);
    testing::CacheFixture f(o);
    const std::vector<SequenceId> ids = f.add_sequences(0, {700, 33, 260});
    for (const int32_t q_len : {1, 4}) {
      SCOPED_TRACE(q_len);
      testing::CacheFixture::Variant rows;
      rows.q_lengths.assign(ids.size(), q_len);
      const auto q = f.random_queries(static_cast<int32_t>(ids.size()) * q_len, DType::kFloat32);
      ASSERT_TRUE(select_prefetch_level("l1").ok());
      const auto l1 = f.decode(0, ids, q, kScale, SplitMode::kDeterministic, 512, rows);
      ASSERT_TRUE(select_prefetch_level("l2").ok());
      const auto l2 = f.decode(0, ids, q, kScale, SplitMode::kDeterministic, 512, rows);
      ASSERT_EQ(l1.out.size(), l2.out.size());
      EXPECT_EQ(std::memcmp(l1.out.data(), l2.out.data(), l1.out.size() * sizeof(float)), 0);
      EXPECT_EQ(std::memcmp(l1.lse.data(), l2.lse.data(), l1.lse.size() * sizeof(float)), 0);
      // And they are the reference's, not the same wrong bits twice.
      const testing::Arithmetic arithmetic = testing::arithmetic_of("cpu", g);
      const auto want = f.reference(0, ids, testing::as_multiplied(q, arithmetic), kScale, rows);
      testing::expect_matches_reference(l1.out, l1.lse, want, DType::kFloat32, arithmetic);
    }
  }
}

}  // namespace
}  // namespace pagoda::cpu
