// The periodic summary: interval counts and a p99 computed the way PromQL's
// histogram_quantile computes it (the same 23.5 ms as the promtool test of
// PagodaDecodeLatencyHigh for the same distribution).

#include <gtest/gtest.h>

#include <vector>

#include "observability/metrics.h"
#include "observability/metrics_summary.h"

namespace pagoda {
namespace {

TEST(BucketQuantile, InterpolatesInsideTheBucketHoldingTheRank) {
  const std::vector<double> bounds = {0.001, 0.005, 0.01, 0.025};
  const std::vector<double> counts = {90, 0, 0, 10, 0};
  EXPECT_DOUBLE_EQ(bucket_quantile(0.99, bounds, counts), 0.01 + 0.015 * 0.9);
  EXPECT_DOUBLE_EQ(bucket_quantile(0.5, bounds, counts), 0.001 * 50.0 / 90.0);
}

TEST(BucketQuantile, EmptyIsZeroAndTheInfBucketIsTheLargestBound) {
  const std::vector<double> bounds = {0.001, 0.005};
  EXPECT_EQ(bucket_quantile(0.99, bounds, std::vector<double>{0, 0, 0}), 0);
  EXPECT_EQ(bucket_quantile(0.99, bounds, std::vector<double>{0, 0, 7}), 0.005);
  EXPECT_EQ(bucket_quantile(0.99, bounds, std::vector<double>{1, 1}), 0);  // sizes disagree
}

TEST(MetricsSummary, CountsTheIntervalOnly) {
  auto created = Metrics::create({.address = ""});
  ASSERT_TRUE(created.ok());
  Metrics& m = *created.value();
  const MetricsSummary start = m.summary_since_last();
  EXPECT_EQ(start.requests, 0u);
  EXPECT_EQ(start.decode_p99_seconds, 0);

  for (int i = 0; i < 90; ++i) m.observe_rpc(RpcMethod::kDecode, 0, 500e-6);
  for (int i = 0; i < 10; ++i) m.observe_rpc(RpcMethod::kDecode, 0, 0.02);
  for (int i = 0; i < 5; ++i) m.observe_rpc(RpcMethod::kDecode, 3, 0.5);  // errors: not latency
  for (int i = 0; i < 3; ++i) m.observe_rpc(RpcMethod::kGetConfig, 0, 0.9);
  m.set_cache(1, 3, 2);
  const MetricsSummary first = m.summary_since_last();
  EXPECT_EQ(first.requests, 108u);
  EXPECT_EQ(first.errors, 5u);
  EXPECT_NEAR(first.decode_p99_seconds, 0.0235, 1e-12);
  EXPECT_EQ(first.kv_usage_ratio, 0.25);
  EXPECT_EQ(first.sequences, 2);
  EXPECT_GT(first.interval_seconds, 0);

  for (int i = 0; i < 10; ++i) m.observe_rpc(RpcMethod::kDecodeStream, 0, 20e-6);
  const MetricsSummary second = m.summary_since_last();
  EXPECT_EQ(second.requests, 10u);
  EXPECT_EQ(second.errors, 0u);
  EXPECT_NEAR(second.decode_p99_seconds, 10e-6 + 15e-6 * 0.99, 1e-15);
}

}  // namespace
}  // namespace pagoda
