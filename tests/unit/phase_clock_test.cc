// The CPU kernel's phase clock (pagoda/cpu_phase_clock.h): off it counts
// nothing, on it counts every task of a launch and time in each phase of
// both paths (the FMAs, and the bf16 matrix unit where the CPU has one), and
// either way a decode has the same bits, which are the reference's.
#include <gtest/gtest.h>

#include <chrono>
#include <cstring>
#include <vector>

#include "pagoda/cpu_phase_clock.h"
#include "pagoda/cpu_targets.h"
#include "unit/cache_fixture.h"

namespace pagoda::cpu {
namespace {

class PhaseClockTest : public ::testing::Test {
 protected:
  void TearDown() override { time_kernel_phases(false); }
};

constexpr float kScale = 0.125f;

TEST_F(PhaseClockTest, OffCountsNothingAndStartingResets) {
  const CacheGeometry g = testing::table_geometry({128, 4, 16, DType::kFloat16, DType::kFloat32});
  testing::CacheFixture f(testing::FixtureOptions(g, 2, 5));
  const std::vector<SequenceId> ids = f.add_sequences(0, {300, 90});
  const auto q = f.random_queries(static_cast<int32_t>(ids.size()), DType::kFloat32);

  EXPECT_FALSE(kernel_phases_timed()) << "off unless started";
  time_kernel_phases(true);
  (void)f.decode(0, ids, q, kScale, SplitMode::kDeterministic, 512);
  ASSERT_GT(kernel_phase_times().tasks, 0);
  time_kernel_phases(false);
  const KernelPhaseTimes stopped = kernel_phase_times();
  (void)f.decode(0, ids, q, kScale, SplitMode::kDeterministic, 512);
  const KernelPhaseTimes after = kernel_phase_times();
  EXPECT_EQ(after.tasks, stopped.tasks) << "a launch with the clock off adds no task";
  EXPECT_EQ(after.seconds, stopped.seconds);

  time_kernel_phases(true);
  const KernelPhaseTimes restarted = kernel_phase_times();
  EXPECT_EQ(restarted.tasks, 0) << "starting the clock starts from zero";
  EXPECT_EQ(restarted.total(), 0.0);
}

// fp16 on the FMAs (GQA 4: rows in the lanes; GQA 8: quad scores on
// AVX-512) and bf16 on what `best` gives it: one task per (chunk, KV head),
// every phase timed, the tasks' time within the launch's on its threads, and
// the same bits as with the clock off.
TEST_F(PhaseClockTest, CountsEveryTaskAndPhaseAndChangesNoBit) {
  struct Case {
    DType dtype;
    int32_t gqa;
  };
  for (const Case c : {Case{DType::kFloat16, 4}, Case{DType::kFloat16, 8}, Case{DType::kBFloat16, 4}}) {
    SCOPED_TRACE(std::string(dtype_name(c.dtype)) + " GQA " + std::to_string(c.gqa));
    const CacheGeometry g = testing::table_geometry({128, c.gqa, 16, c.dtype, DType::kFloat32});
    constexpr int32_t kThreads = 2;
    testing::CacheFixture f(testing::FixtureOptions(g, kThreads, 7));
    // Deterministic 512-token chunks: 700 tokens are two, 33 and 260 one each.
    const std::vector<SequenceId> ids = f.add_sequences(0, {700, 33, 260});
    constexpr int64_t kChunks = 4;
    const auto q = f.random_queries(static_cast<int32_t>(ids.size()), DType::kFloat32);

    time_kernel_phases(false);
    const auto plain = f.decode(0, ids, q, kScale, SplitMode::kDeterministic, 512);
    time_kernel_phases(true);
    const auto t0 = std::chrono::steady_clock::now();
    const auto timed = f.decode(0, ids, q, kScale, SplitMode::kDeterministic, 512);
    const double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    const KernelPhaseTimes times = kernel_phase_times();
    time_kernel_phases(false);

    EXPECT_EQ(times.tasks, kChunks * g.num_kv_heads);
    for (const KernelPhase p : {KernelPhase::kScores, KernelPhase::kSoftmax, KernelPhase::kValues,
                                KernelPhase::kMerge, KernelPhase::kOther}) {
      EXPECT_GT(times.at(p), 0.0) << "phase " << static_cast<int>(p);
    }
    EXPECT_LE(times.total(), wall * kThreads) << "tasks run inside the launch, on its threads";

    ASSERT_EQ(plain.out.size(), timed.out.size());
    EXPECT_EQ(std::memcmp(plain.out.data(), timed.out.data(), plain.out.size() * sizeof(float)), 0);
    EXPECT_EQ(std::memcmp(plain.lse.data(), timed.lse.data(), plain.lse.size() * sizeof(float)), 0);
    const testing::Arithmetic arithmetic = testing::arithmetic_of("cpu", g);
    const auto want = f.reference(0, ids, testing::as_multiplied(q, arithmetic), kScale);
    testing::expect_matches_reference(timed.out, timed.lse, want, DType::kFloat32, arithmetic);
  }
}

}  // namespace
}  // namespace pagoda::cpu
