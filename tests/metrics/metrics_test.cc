// Records a known sequence of observations through pagoda::Metrics, scrapes /metrics
// over real HTTP on loopback, and checks the exact counts, buckets and label sets.

#include "observability/metrics.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <set>
#include <thread>
#include <vector>

#include "scrape.h"

namespace pagoda {
namespace {

using testing::Exposition;
using testing::LabelSet;

// One Metrics serves the whole suite: stopping an Exposer takes about 2 s (civetweb's
// poll quantum). Tests therefore assert the exact change between a scrape taken before
// their observations and one after, and set gauges to values of their own.
class MetricsScrapeTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    auto created = Metrics::create({.address = "127.0.0.1:0"});
    ASSERT_TRUE(created.ok()) << created.status().message();
    metrics_ = std::move(created.value()).release();
    ASSERT_GT(metrics_->port(), 0);
    initial_ = new Exposition(scrape());
  }
  static void TearDownTestSuite() {
    delete metrics_;
    metrics_ = nullptr;
    delete initial_;
    initial_ = nullptr;
  }
  void SetUp() override { before_ = scrape(); }

  static Exposition scrape() {
    const testing::HttpReply reply = testing::http_get_loopback(metrics_->port(), "/metrics");
    EXPECT_EQ(reply.status, 200) << reply.error;
    std::vector<std::string> errors;
    Exposition exposition = testing::parse_exposition(reply.body, &errors);
    EXPECT_TRUE(errors.empty()) << "unparsed line: " << errors.front();
    return exposition;
  }

  // How much the sample changed since SetUp (a series that did not exist counts from 0);
  // nullopt when it does not exist now.
  std::optional<double> delta(const Exposition& after, const std::string& name,
                              const LabelSet& labels = {}) const {
    const auto now = after.value(name, labels);
    if (!now) return std::nullopt;
    return *now - before_.value(name, labels).value_or(0);
  }

  // Change of the cumulative count of the bucket of `name` whose upper bound is `le`.
  std::optional<double> bucket_delta(const Exposition& after, const std::string& name,
                                     const LabelSet& labels, double le) const {
    const auto count = [&](const Exposition& e) -> std::optional<double> {
      for (const auto& s : e.all(name + "_bucket")) {
        LabelSet rest = s.labels;
        const auto it = rest.find("le");
        if (it == rest.end() || std::stod(it->second) != le) continue;
        rest.erase("le");
        if (rest == labels) return s.value;
      }
      return std::nullopt;
    };
    const auto now = count(after);
    if (!now) return std::nullopt;
    return *now - count(before_).value_or(0);
  }

  static Metrics* metrics_;
  static Exposition* initial_;  // scraped before any test observed anything
  Exposition before_;
};
Metrics* MetricsScrapeTest::metrics_ = nullptr;
Exposition* MetricsScrapeTest::initial_ = nullptr;

TEST_F(MetricsScrapeTest, RpcDurationsAndErrorsCountExactly) {
  const std::vector<double> ok_seconds = {20e-6, 20e-6, 3e-3, 3e-3, 2.0};
  for (double s : ok_seconds) metrics_->observe_rpc(RpcMethod::kDecode, 0, s);
  metrics_->observe_rpc(RpcMethod::kDecode, 3, 40e-6);
  metrics_->observe_rpc(RpcMethod::kDecode, 3, 40e-6);
  metrics_->observe_rpc(RpcMethod::kAppendKV, 5, 1e-3);

  const Exposition e = scrape();
  const LabelSet decode_ok{{"method", "Decode"}, {"code", "OK"}};
  const LabelSet decode_invalid{{"method", "Decode"}, {"code", "INVALID_ARGUMENT"}};
  const LabelSet append_not_found{{"method", "AppendKV"}, {"code", "NOT_FOUND"}};
  EXPECT_EQ(e.types.at("pagoda_rpc_duration_seconds"), "histogram");
  EXPECT_EQ(e.types.at("pagoda_rpc_errors_total"), "counter");
  EXPECT_EQ(delta(e, "pagoda_rpc_duration_seconds_count", decode_ok), 5);
  double sum = 0;
  for (double s : ok_seconds) sum += s;
  EXPECT_DOUBLE_EQ(delta(e, "pagoda_rpc_duration_seconds_sum", decode_ok).value_or(-1), sum);
  EXPECT_EQ(bucket_delta(e, "pagoda_rpc_duration_seconds", decode_ok, 10e-6), 0);
  EXPECT_EQ(bucket_delta(e, "pagoda_rpc_duration_seconds", decode_ok, 25e-6), 2);
  EXPECT_EQ(bucket_delta(e, "pagoda_rpc_duration_seconds", decode_ok, 2.5e-3), 2);
  EXPECT_EQ(bucket_delta(e, "pagoda_rpc_duration_seconds", decode_ok, 5e-3), 4);
  EXPECT_EQ(bucket_delta(e, "pagoda_rpc_duration_seconds", decode_ok, 1.0), 4);
  EXPECT_EQ(bucket_delta(e, "pagoda_rpc_duration_seconds", decode_ok, std::numeric_limits<double>::infinity()), 5);

  EXPECT_EQ(delta(e, "pagoda_rpc_duration_seconds_count", decode_invalid), 2);
  EXPECT_EQ(delta(e, "pagoda_rpc_errors_total", decode_invalid), 2);
  EXPECT_EQ(delta(e, "pagoda_rpc_errors_total", append_not_found), 1);
  EXPECT_EQ(delta(e, "pagoda_rpc_duration_seconds_count", append_not_found), 1);
  // OK is never an error, and no other error series moved.
  EXPECT_FALSE(e.value("pagoda_rpc_errors_total", decode_ok).has_value());
  for (const auto& s : e.all("pagoda_rpc_errors_total")) {
    if (s.labels == decode_invalid || s.labels == append_not_found) continue;
    EXPECT_EQ(delta(e, "pagoda_rpc_errors_total", s.labels), 0) << s.labels.at("method");
  }
}

TEST_F(MetricsScrapeTest, EveryMethodHasAnOkSeriesFromTheStart) {
  const Exposition& e = *initial_;
  EXPECT_TRUE(e.all("pagoda_rpc_errors_total").empty());  // error series appear on first use
  std::set<std::string> methods;
  for (const auto& s : e.all("pagoda_rpc_duration_seconds_count")) {
    EXPECT_EQ(s.labels.at("code"), "OK");
    EXPECT_EQ(s.value, 0);
    methods.insert(s.labels.at("method"));
  }
  EXPECT_EQ(methods, (std::set<std::string>{"GetConfig", "CreateSequence", "AppendKV", "Decode",
                                            "DecodeStream", "ForkSequence", "FreeSequence",
                                            "GetSequence", "TruncateSequence", "RegisterSharedMemory",
                                            "UnregisterSharedMemory", "GetSharedMemoryStatus", "ExportSequence",
                                            "ImportSequence"}));
}

TEST_F(MetricsScrapeTest, CodesOutsideGrpcsRangeCountAsUnknown) {
  metrics_->observe_rpc(RpcMethod::kGetConfig, 99, 1e-3);
  metrics_->observe_rpc(RpcMethod::kGetConfig, -1, 1e-3);
  const Exposition e = scrape();
  EXPECT_EQ(delta(e, "pagoda_rpc_errors_total", {{"method", "GetConfig"}, {"code", "UNKNOWN"}}), 2);
}

TEST_F(MetricsScrapeTest, StageHistogramsHaveTheFiveStages) {
  metrics_->observe_stage(DecodeStage::kQueue, 30e-6);
  metrics_->observe_stage(DecodeStage::kAttention, 200e-6);
  metrics_->observe_stage(DecodeStage::kAttention, 300e-6);
  const Exposition e = scrape();
  std::set<std::string> stages;
  for (const auto& s : e.all("pagoda_decode_stage_seconds_count")) stages.insert(s.labels.at("stage"));
  EXPECT_EQ(stages, (std::set<std::string>{"queue", "append", "attention", "merge", "transfer"}));
  EXPECT_EQ(delta(e, "pagoda_decode_stage_seconds_count", {{"stage", "queue"}}), 1);
  EXPECT_EQ(delta(e, "pagoda_decode_stage_seconds_count", {{"stage", "attention"}}), 2);
  EXPECT_EQ(delta(e, "pagoda_decode_stage_seconds_count", {{"stage", "merge"}}), 0);
  EXPECT_EQ(bucket_delta(e, "pagoda_decode_stage_seconds", {{"stage", "attention"}}, 250e-6), 1);
}

TEST_F(MetricsScrapeTest, BatchSizeAndContextTokens) {
  const std::vector<int32_t> first = {10, 100, 5000};
  const std::vector<int32_t> second = {16};
  metrics_->observe_batch(first);
  metrics_->observe_batch(second);
  const Exposition e = scrape();
  EXPECT_EQ(delta(e, "pagoda_decode_batch_size_count"), 2);
  EXPECT_EQ(delta(e, "pagoda_decode_batch_size_sum"), 4);
  EXPECT_EQ(bucket_delta(e, "pagoda_decode_batch_size", {}, 1), 1);
  EXPECT_EQ(bucket_delta(e, "pagoda_decode_batch_size", {}, 2), 1);
  EXPECT_EQ(bucket_delta(e, "pagoda_decode_batch_size", {}, 4), 2);
  EXPECT_EQ(delta(e, "pagoda_decode_context_tokens_count"), 4);
  EXPECT_EQ(delta(e, "pagoda_decode_context_tokens_sum"), 5126);
  EXPECT_EQ(bucket_delta(e, "pagoda_decode_context_tokens", {}, 16), 2);  // 10 and 16 (le is <=)
  EXPECT_EQ(bucket_delta(e, "pagoda_decode_context_tokens", {}, 64), 2);
  EXPECT_EQ(bucket_delta(e, "pagoda_decode_context_tokens", {}, 128), 3);
  EXPECT_EQ(bucket_delta(e, "pagoda_decode_context_tokens", {}, 4096), 3);
  EXPECT_EQ(bucket_delta(e, "pagoda_decode_context_tokens", {}, 8192), 4);
}

TEST_F(MetricsScrapeTest, KvReadAndComputeCounters) {
  metrics_->add_kv_read(1.5e6, 4e6, 0.25);
  metrics_->add_kv_read(0.5e6, 0, 0.75);
  const Exposition e = scrape();
  EXPECT_EQ(e.types.at("pagoda_kv_read_bytes_total"), "counter");
  EXPECT_EQ(delta(e, "pagoda_kv_read_bytes_total"), 2e6);
  EXPECT_EQ(e.types.at("pagoda_kv_shared_bytes_total"), "counter");
  EXPECT_EQ(delta(e, "pagoda_kv_shared_bytes_total"), 4e6);
  EXPECT_EQ(delta(e, "pagoda_attention_compute_seconds_total"), 1.0);
}

TEST_F(MetricsScrapeTest, CacheGauges) {
  metrics_->set_cache(30, 70, 4);
  Exposition e = scrape();
  EXPECT_EQ(e.value("pagoda_kv_blocks", {{"state", "used"}}), 30);
  EXPECT_EQ(e.value("pagoda_kv_blocks", {{"state", "free"}}), 70);
  EXPECT_EQ(e.all("pagoda_kv_blocks").size(), 2u);
  EXPECT_DOUBLE_EQ(e.value("pagoda_kv_usage_ratio").value_or(-1), 0.3);
  EXPECT_EQ(e.value("pagoda_sequences"), 4);

  metrics_->set_cache(0, 0, 0);  // an empty cache reads 0 %, not NaN
  e = scrape();
  EXPECT_EQ(e.value("pagoda_kv_usage_ratio"), 0);
}

TEST_F(MetricsScrapeTest, BuildInfoHasOneSeriesWithTheLastLabels) {
  metrics_->set_build_info({"0.0.1", "cuda", "old"});
  metrics_->set_build_info({"0.1.0", "cpu", "Test CPU \"x86\""});
  const Exposition e = scrape();
  ASSERT_EQ(e.all("pagoda_build_info").size(), 1u);
  EXPECT_EQ(e.value("pagoda_build_info",
                    {{"version", "0.1.0"}, {"backend", "cpu"}, {"device", "Test CPU \"x86\""}}),
            1);
}

TEST_F(MetricsScrapeTest, DeterminismCountersAndMaxDiffByMode) {
  for (int i = 0; i < 3; ++i) metrics_->record_determinism_check(SplitMode::kDeterministic, false, 0);
  metrics_->record_determinism_check(SplitMode::kFast, true, 0.125);
  metrics_->record_determinism_check(SplitMode::kFast, false, 0.0625);
  const Exposition e = scrape();
  const LabelSet det{{"mode", "deterministic"}};
  const LabelSet fast{{"mode", "fast"}};
  EXPECT_EQ(delta(e, "pagoda_determinism_checks_total", det), 3);
  EXPECT_EQ(delta(e, "pagoda_determinism_checks_total", fast), 2);
  EXPECT_EQ(delta(e, "pagoda_determinism_mismatches_total", det), 0);
  EXPECT_EQ(delta(e, "pagoda_determinism_mismatches_total", fast), 1);
  EXPECT_EQ(e.types.at("pagoda_determinism_max_abs_diff"), "gauge");
  EXPECT_EQ(e.value("pagoda_determinism_max_abs_diff", det), 0);
  EXPECT_EQ(e.value("pagoda_determinism_max_abs_diff", fast), 0.125);
}

TEST_F(MetricsScrapeTest, EveryHistogramIsCumulativeAndEndsAtItsCount) {
  for (int i = 0; i < 50; ++i) {
    const double seconds = 1e-6 * std::pow(1.4, i);  // 1 µs .. ~15 s, across every bucket
    metrics_->observe_rpc(RpcMethod::kDecode, i % 3 == 0 ? 8 : 0, seconds);
    metrics_->observe_stage(static_cast<DecodeStage>(i % kNumDecodeStages), seconds);
  }
  const std::vector<int32_t> lengths = {1, 17, 300, 70000, 2000000};
  metrics_->observe_batch(lengths);
  const Exposition e = scrape();
  int histograms_checked = 0;
  for (const auto& [family, type] : e.types) {
    if (type != "histogram") continue;
    // Group the buckets of each series (labels less `le`) in exposition order.
    std::map<LabelSet, std::vector<std::pair<double, double>>> series;
    for (const auto& s : e.all(family + "_bucket")) {
      LabelSet rest = s.labels;
      const double le = std::stod(rest.at("le"));
      rest.erase("le");
      series[rest].emplace_back(le, s.value);
    }
    ASSERT_FALSE(series.empty()) << family;
    for (const auto& [labels, buckets] : series) {
      for (std::size_t i = 1; i < buckets.size(); ++i) {
        EXPECT_LT(buckets[i - 1].first, buckets[i].first) << family;
        EXPECT_LE(buckets[i - 1].second, buckets[i].second) << family << " le=" << buckets[i].first;
      }
      EXPECT_TRUE(std::isinf(buckets.back().first)) << family;
      EXPECT_EQ(buckets.back().second, e.value(family + "_count", labels)) << family;
      ++histograms_checked;
    }
  }
  // The 8 methods' OK series, Decode RESOURCE_EXHAUSTED, 5 stages, batch size, context tokens.
  EXPECT_GE(histograms_checked, 8 + 1 + 5 + 2);
}

TEST_F(MetricsScrapeTest, ConcurrentFirstUseOfASeriesLosesNoObservation) {
  constexpr int kThreads = 4;
  constexpr int kCalls = 2000;
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([this] {
      for (int i = 0; i < kCalls; ++i) metrics_->observe_rpc(RpcMethod::kForkSequence, 14, 1e-4);
    });
  }
  for (auto& t : threads) t.join();
  const Exposition e = scrape();
  const LabelSet labels{{"method", "ForkSequence"}, {"code", "UNAVAILABLE"}};
  EXPECT_EQ(delta(e, "pagoda_rpc_duration_seconds_count", labels), kThreads * kCalls);
  EXPECT_EQ(delta(e, "pagoda_rpc_errors_total", labels), kThreads * kCalls);
}

TEST(MetricsCreate, MalformedAddressIsInvalidArgument) {
  for (const char* address : {"127.0.0.1", "127.0.0.1:", ":9464", "127.0.0.1:70000", "host:12x"}) {
    auto created = Metrics::create({.address = address});
    ASSERT_FALSE(created.ok()) << address;
    EXPECT_EQ(created.status().code(), StatusCode::kInvalidArgument) << address;
    EXPECT_NE(created.status().message().find("metrics_address"), std::string::npos);
    EXPECT_NE(created.status().message().find(address), std::string::npos);
  }
}

TEST_F(MetricsScrapeTest, PortInUseIsUnavailable) {
  const std::string taken = "127.0.0.1:" + std::to_string(metrics_->port());
  auto second = Metrics::create({.address = taken});
  ASSERT_FALSE(second.ok());
  EXPECT_EQ(second.status().code(), StatusCode::kUnavailable);
  EXPECT_NE(second.status().message().find(taken), std::string::npos);
}

TEST(MetricsCreate, EmptyAddressRecordsWithoutServing) {
  auto created = Metrics::create({.address = ""});
  ASSERT_TRUE(created.ok());
  EXPECT_EQ(created.value()->port(), 0);
  created.value()->observe_rpc(RpcMethod::kDecode, 0, 1e-4);  // must not crash without an endpoint
}

TEST(MetricsCreate, NonPositiveDeterminismWindowIsInvalidArgument) {
  auto created = Metrics::create({.address = "", .determinism_window = std::chrono::seconds(0)});
  ASSERT_FALSE(created.ok());
  EXPECT_EQ(created.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(created.status().message().find("determinism_window"), std::string::npos);
}

}  // namespace
}  // namespace pagoda
