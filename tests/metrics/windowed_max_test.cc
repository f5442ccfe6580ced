// The sliding-window maximum behind pagoda_determinism_max_abs_diff, on synthetic time.

#include "observability/metrics_window.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>

namespace pagoda {
namespace {

using std::chrono::seconds;
const WindowedMax::Clock::time_point kStart{seconds(1000 * 60)};  // a slot boundary

TEST(WindowedMax, EmptyWindowIsZero) {
  WindowedMax w(seconds(60));
  EXPECT_EQ(w.max(kStart), 0);
}

TEST(WindowedMax, KeepsTheLargestWhileInTheWindow) {
  WindowedMax w(seconds(60));
  w.record(0.5, kStart);
  w.record(0.25, kStart + seconds(20));
  EXPECT_EQ(w.max(kStart + seconds(20)), 0.5);
  EXPECT_EQ(w.max(kStart + seconds(49)), 0.5);   // 5/6 of the window: always still in
  EXPECT_EQ(w.max(kStart + seconds(61)), 0.25);  // past the window: only the later value
  EXPECT_EQ(w.max(kStart + seconds(81)), 0);
}

TEST(WindowedMax, ASlotReusedAfterAFullTurnForgetsItsOldValue) {
  WindowedMax w(seconds(60));
  w.record(9.0, kStart);
  w.record(1.0, kStart + seconds(60));  // same ring slot, a window later
  EXPECT_EQ(w.max(kStart + seconds(60)), 1.0);
}

TEST(WindowedMax, NanCountsAsInfinite) {
  WindowedMax w(seconds(60));
  w.record(std::numeric_limits<double>::quiet_NaN(), kStart);
  w.record(3.0, kStart);
  EXPECT_TRUE(std::isinf(w.max(kStart)));
}

}  // namespace
}  // namespace pagoda
