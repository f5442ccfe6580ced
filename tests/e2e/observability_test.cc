// Observability end to end: one in-process server with /metrics on loopback and the
// determinism checker at rate 1. Known workloads go through gRPC; the scraped
// exposition must show their exact counts, the checker one check per decoded
// sequence, and the log lines (captured as JSON) each error and no request at info.
//
// The server is shared by the suite (stopping an exposition server takes about 2 s),
// so tests assert the change between a scrape before and one after their workload.

#include <gtest/gtest.h>
#include <spdlog/sinks/base_sink.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <cctype>
#include <optional>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstring>
#include <limits>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "cache/cache_manager.h"
#include "engine/determinism_checker.h"
#include "capture_sink.h"
#include "e2e_fixture.h"
#include "engine/engine.h"
#include "scrape.h"

namespace pagoda::e2e {
namespace {

using testing::Exposition;
using testing::LabelSet;


// A flat JSON object of string and number values, as the JSON log format writes:
// {"time":"...","level":"info","thread":123,"msg":"..."}. Returns key -> raw value.
bool parse_flat_json(const std::string& s, std::map<std::string, std::string>& out) {
  size_t i = 0;
  auto string_at = [&](std::string& value) {
    if (i >= s.size() || s[i] != '"') return false;
    for (++i; i < s.size(); ++i) {
      const char c = s[i];
      if (static_cast<unsigned char>(c) < 0x20) return false;  // raw control character
      if (c == '"') {
        ++i;
        return true;
      }
      if (c == '\\') {
        if (++i >= s.size()) return false;
        const char e = s[i];
        if (e == 'u') {
          if (i + 4 >= s.size()) return false;
          for (int k = 1; k <= 4; ++k)
            if (!std::isxdigit(static_cast<unsigned char>(s[i + k]))) return false;
          i += 4;
          value += '?';
        } else if (std::strchr("\"\\/bfnrt", e) != nullptr) {
          value += e;
        } else {
          return false;
        }
        continue;
      }
      value += c;
    }
    return false;
  };
  if (s.empty() || s.front() != '{' || s.back() != '}') return false;
  i = 1;
  for (;;) {
    std::string key;
    std::string value;
    if (!string_at(key) || i >= s.size() || s[i++] != ':') return false;
    if (i < s.size() && s[i] == '"') {
      if (!string_at(value)) return false;
    } else {
      const size_t begin = i;
      while (i < s.size() && (std::isdigit(static_cast<unsigned char>(s[i])) || s[i] == '-' || s[i] == '.')) ++i;
      if (i == begin) return false;
      value = s.substr(begin, i - begin);
    }
    out[key] = value;
    if (i >= s.size()) return false;
    if (s[i] == '}') return i + 1 == s.size();
    if (s[i++] != ',') return false;
  }
}

// Holds the checker's worker inside its first check until released (a test-only
// perturbation that changes nothing), so that later checks wait in its queue.
std::atomic<bool> g_hold_checker{false};
std::atomic<bool> g_checker_held{false};
void hold_while_asked(void*, size_t) {
  g_checker_held = true;
  while (g_hold_checker.load()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
}
// Flips the lowest bit of the first output element.
void flip_one_bit(void* out, size_t) { static_cast<unsigned char*>(out)[0] ^= 1; }

class ObservabilityTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    sink_ = std::make_shared<CaptureSink>();
    spdlog::set_default_logger(std::make_shared<spdlog::logger>("capture", sink_));
    ServerConfig c = small_config();
    c.metrics_address = "127.0.0.1:0";
    c.determinism_sample_rate = 1;
    c.log_level = "info";
    c.log_format = "json";
    c.log_summary_interval = 0.2;
    server_ = start_server(c).release();
    ASSERT_NE(server_, nullptr);
    ASSERT_FALSE(server_->metrics_address().empty());
  }
  static void TearDownTestSuite() {
    delete server_;
    server_ = nullptr;
    spdlog::set_default_logger(std::make_shared<spdlog::logger>("", spdlog::sinks_init_list{}));
    sink_.reset();
  }

  void SetUp() override {
    ASSERT_NE(server_, nullptr);
    stub_ = make_stub(*server_);
    g_ = server_->config().geometry;
    session_ = Session{stub_.get(), g_};
  }

  static int metrics_port() {
    const std::string& a = server_->metrics_address();
    return std::atoi(a.c_str() + a.rfind(':') + 1);
  }
  // Waits for the checker to finish, then scrapes.
  static Exposition scrape() {
    server_->checker().wait_idle();
    const testing::HttpReply reply = testing::http_get_loopback(metrics_port(), "/metrics");
    EXPECT_EQ(reply.status, 200) << reply.error;
    std::vector<std::string> errors;
    Exposition e = testing::parse_exposition(reply.body, &errors);
    EXPECT_TRUE(errors.empty()) << errors.front();
    return e;
  }
  static double value(const Exposition& e, const std::string& name, const LabelSet& labels = {}) {
    return e.value(name, labels).value_or(0.0);
  }
  static double delta(const Exposition& before, const Exposition& after, const std::string& name,
                      const LabelSet& labels = {}) {
    return value(after, name, labels) - value(before, name, labels);
  }

  uint64_t make_sequence(int32_t tokens) {
    uint64_t id = 0;
    EXPECT_TRUE(session_.create(id, "obs").ok());
    for (int32_t layer = 0; layer < g_.num_layers; ++layer) {
      const size_t n = static_cast<size_t>(tokens) * g_.num_kv_heads * g_.head_dim;
      EXPECT_TRUE(session_.append(id, layer, random_values(rng_, n), random_values(rng_, n)).ok());
    }
    return id;
  }
  std::vector<float> random_q(size_t batch) { return random_values(rng_, batch * g_.num_q_heads * g_.head_dim); }
  void free_sequence(uint64_t id) {
    grpc::ClientContext ctx;
    v1::FreeSequenceRequest req;
    req.set_sequence_id(id);
    v1::FreeSequenceResponse resp;
    EXPECT_TRUE(stub_->FreeSequence(&ctx, req, &resp).ok());
  }

  static PagodaServer* server_;
  static std::shared_ptr<CaptureSink> sink_;
  std::unique_ptr<v1::DecodeAttention::Stub> stub_;
  CacheGeometry g_;
  Session session_;
  std::mt19937 rng_{2024};
};

PagodaServer* ObservabilityTest::server_ = nullptr;
std::shared_ptr<CaptureSink> ObservabilityTest::sink_;

const LabelSet kDecodeOk{{"method", "Decode"}, {"code", "OK"}};
const LabelSet kDeterministic{{"mode", "deterministic"}};

TEST_F(ObservabilityTest, DecodeCallsStagesBytesAndChecksAreCountedExactly) {
  const Exposition before = scrape();
  const Engine::Counters launches_before = server_->engine().counters();
  const DeterminismChecker::Stats checks_before = server_->checker().stats();

  const std::vector<uint64_t> ids{make_sequence(5), make_sequence(17), make_sequence(40)};
  constexpr int kCalls = 7;
  int64_t tokens = 0;
  for (int call = 0; call < kCalls; ++call) {
    v1::DecodeResponse response;
    ASSERT_TRUE(session_.decode(call % g_.num_layers, ids, random_q(ids.size()), response).ok());
    for (int32_t length : response.lengths()) tokens += length;
  }
  const Exposition after = scrape();
  const Engine::Counters launches_after = server_->engine().counters();
  const auto launches = static_cast<double>(launches_after.launches - launches_before.launches);
  EXPECT_EQ(launches, kCalls);  // sequential calls: one launch each

  EXPECT_EQ(delta(before, after, "pagoda_rpc_duration_seconds_count", kDecodeOk), kCalls);
  EXPECT_EQ(delta(before, after, "pagoda_rpc_duration_seconds_count", {{"method", "CreateSequence"}, {"code", "OK"}}),
            3);
  EXPECT_EQ(delta(before, after, "pagoda_rpc_duration_seconds_count", {{"method", "AppendKV"}, {"code", "OK"}}),
            3 * g_.num_layers);
  EXPECT_GT(delta(before, after, "pagoda_rpc_duration_seconds_sum", kDecodeOk), 0);
  for (const char* stage : {"queue", "attention", "merge"}) {
    EXPECT_EQ(delta(before, after, "pagoda_decode_stage_seconds_count", {{"stage", stage}}), launches) << stage;
  }
  // No K/V came with the calls, and the CPU has no transfers.
  EXPECT_EQ(delta(before, after, "pagoda_decode_stage_seconds_count", {{"stage", "append"}}), 0);
  EXPECT_EQ(delta(before, after, "pagoda_decode_stage_seconds_count", {{"stage", "transfer"}}), 0);
  EXPECT_EQ(delta(before, after, "pagoda_decode_batch_size_count"), launches);
  EXPECT_EQ(delta(before, after, "pagoda_decode_batch_size_sum"), 3 * kCalls);
  EXPECT_EQ(delta(before, after, "pagoda_decode_context_tokens_count"), 3 * kCalls);
  EXPECT_EQ(delta(before, after, "pagoda_decode_context_tokens_sum"), static_cast<double>(tokens));
  EXPECT_EQ(delta(before, after, "pagoda_kv_read_bytes_total"),
            static_cast<double>(tokens) * static_cast<double>(g_.token_kv_bytes()));
  EXPECT_GT(delta(before, after, "pagoda_attention_compute_seconds_total"), 0);

  // Rate 1: every decoded sequence re-checked once, bit-identical in deterministic mode.
  EXPECT_EQ(delta(before, after, "pagoda_determinism_checks_total", kDeterministic), 3 * kCalls);
  EXPECT_EQ(delta(before, after, "pagoda_determinism_mismatches_total", kDeterministic), 0);
  EXPECT_EQ(delta(before, after, "pagoda_determinism_checks_total", {{"mode", "fast"}}), 0);
  EXPECT_EQ(value(after, "pagoda_determinism_max_abs_diff", kDeterministic), 0);
  const DeterminismChecker::Stats checks_after = server_->checker().stats();
  EXPECT_EQ(checks_after.checked - checks_before.checked, 3u * kCalls);
  EXPECT_EQ(checks_after.skipped, checks_before.skipped);
  for (uint64_t id : ids) free_sequence(id);
}

TEST_F(ObservabilityTest, StreamResponsesAndAppendsWithDecodeAreObserved) {
  const std::vector<uint64_t> ids{make_sequence(3), make_sequence(9)};
  const Exposition before = scrape();
  grpc::ClientContext ctx;
  auto stream = stub_->DecodeStream(&ctx);
  constexpr int kSteps = 4;
  for (int step = 0; step < kSteps; ++step) {
    const size_t kv = ids.size() * g_.num_kv_heads * g_.head_dim;
    v1::DecodeRequest req = session_.decode_request(0, ids, random_q(ids.size()), random_values(rng_, kv),
                                                    random_values(rng_, kv));
    req.set_request_id(100 + step);
    ASSERT_TRUE(stream->Write(req));
  }
  v1::DecodeRequest bad = session_.decode_request(0, {999999}, random_q(1));
  bad.set_request_id(555);
  ASSERT_TRUE(stream->Write(bad));
  stream->WritesDone();
  v1::DecodeResponse response;
  int answered = 0;
  while (stream->Read(&response)) ++answered;
  ASSERT_TRUE(stream->Finish().ok());
  ASSERT_EQ(answered, kSteps + 1);

  const Exposition after = scrape();
  EXPECT_EQ(delta(before, after, "pagoda_rpc_duration_seconds_count", {{"method", "DecodeStream"}, {"code", "OK"}}),
            kSteps);
  EXPECT_EQ(delta(before, after, "pagoda_rpc_errors_total", {{"method", "DecodeStream"}, {"code", "NOT_FOUND"}}), 1);
  // Every step appended one token per sequence before attending.
  const double launches = delta(before, after, "pagoda_decode_batch_size_count");
  EXPECT_GE(launches, 1);
  EXPECT_EQ(delta(before, after, "pagoda_decode_stage_seconds_count", {{"stage", "append"}}), launches);
  EXPECT_EQ(delta(before, after, "pagoda_determinism_checks_total", kDeterministic), kSteps * ids.size());
  EXPECT_EQ(delta(before, after, "pagoda_determinism_mismatches_total", kDeterministic), 0);
  for (uint64_t id : ids) free_sequence(id);
}

TEST_F(ObservabilityTest, ErrorsAreCountedByMethodAndCodeAndLoggedWithTheRequestId) {
  const uint64_t id = make_sequence(4);
  const Exposition before = scrape();

  v1::DecodeRequest unknown = session_.decode_request(0, {id + 1000}, random_q(1));
  unknown.set_request_id(4242);
  {
    grpc::ClientContext ctx;
    v1::DecodeResponse r;
    EXPECT_EQ(stub_->Decode(&ctx, unknown, &r).error_code(), grpc::StatusCode::NOT_FOUND);
  }
  v1::DecodeRequest bad_layer = session_.decode_request(0, {id}, random_q(1));
  bad_layer.set_layer(99);
  bad_layer.set_request_id(4343);
  {
    grpc::ClientContext ctx;
    v1::DecodeResponse r;
    EXPECT_EQ(stub_->Decode(&ctx, bad_layer, &r).error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  }
  v1::GetSequenceResponse info;
  EXPECT_EQ(session_.get(id + 1000, info).error_code(), grpc::StatusCode::NOT_FOUND);

  const Exposition after = scrape();
  EXPECT_EQ(delta(before, after, "pagoda_rpc_errors_total", {{"method", "Decode"}, {"code", "NOT_FOUND"}}), 1);
  EXPECT_EQ(delta(before, after, "pagoda_rpc_errors_total", {{"method", "Decode"}, {"code", "INVALID_ARGUMENT"}}), 1);
  EXPECT_EQ(delta(before, after, "pagoda_rpc_errors_total", {{"method", "GetSequence"}, {"code", "NOT_FOUND"}}), 1);
  EXPECT_EQ(delta(before, after, "pagoda_rpc_duration_seconds_count", {{"method", "Decode"}, {"code", "NOT_FOUND"}}),
            1);
  EXPECT_EQ(delta(before, after, "pagoda_rpc_duration_seconds_count", kDecodeOk), 0);
  EXPECT_EQ(delta(before, after, "pagoda_determinism_checks_total", kDeterministic), 0);

  // One warning a failed call, naming method, request id, code and the field.
  int found = 0;
  for (const std::string& line : sink_->lines()) {
    if (line.find("\"level\":\"warning\"") == std::string::npos) continue;
    if (line.find("Decode request_id=4242 layer=0 failed: NOT_FOUND") != std::string::npos) ++found;
    if (line.find("Decode request_id=4343 layer=99 failed: INVALID_ARGUMENT layer:") != std::string::npos) ++found;
  }
  EXPECT_EQ(found, 2);
  free_sequence(id);
}

TEST_F(ObservabilityTest, HistogramBucketsAreCumulativeAndEndAtTheCount) {
  make_sequence(2);  // some observations in every histogram family
  const Exposition e = scrape();
  int histograms = 0;
  for (const auto& [family, type] : e.types) {
    if (type != "histogram") continue;
    // Series by their labels without "le": (le, count) pairs.
    std::map<LabelSet, std::vector<std::pair<double, double>>> series;
    for (const testing::Sample& s : e.all(family + "_bucket")) {
      LabelSet labels = s.labels;
      const std::string le = labels.at("le");
      labels.erase("le");
      series[labels].push_back({le == "+Inf" ? std::numeric_limits<double>::infinity() : std::stod(le), s.value});
    }
    for (auto& [labels, buckets] : series) {
      ++histograms;
      std::sort(buckets.begin(), buckets.end());
      ASSERT_FALSE(buckets.empty());
      EXPECT_TRUE(std::isinf(buckets.back().first)) << family;
      for (size_t i = 1; i < buckets.size(); ++i) {
        EXPECT_LE(buckets[i - 1].second, buckets[i].second) << family << " le=" << buckets[i].first;
      }
      const std::optional<double> count = e.value(family + "_count", labels);
      ASSERT_TRUE(count.has_value()) << family;
      EXPECT_EQ(buckets.back().second, *count) << family;
    }
  }
  // rpc (8 methods at least), 5 stages, batch size, context tokens.
  EXPECT_GE(histograms, 8 + 5 + 2);
}

TEST_F(ObservabilityTest, CacheGaugesMatchGetConfig) {
  const uint64_t a = make_sequence(13);
  const uint64_t b = make_sequence(30);
  uint64_t c = 0;
  {
    grpc::ClientContext ctx;
    v1::ForkSequenceRequest req;
    req.set_source_id(b);
    v1::ForkSequenceResponse resp;
    ASSERT_TRUE(stub_->ForkSequence(&ctx, req, &resp).ok());
    c = resp.sequence_id();
  }
  free_sequence(a);
  v1::DecodeResponse response;
  ASSERT_TRUE(session_.decode(1, {b, c}, random_q(2), response).ok());

  const Exposition e = scrape();
  v1::GetConfigResponse config;
  ASSERT_TRUE(session_.config(config).ok());
  const double free_blocks = value(e, "pagoda_kv_blocks", {{"state", "free"}});
  const double used_blocks = value(e, "pagoda_kv_blocks", {{"state", "used"}});
  EXPECT_EQ(free_blocks, config.free_blocks());
  EXPECT_EQ(used_blocks, config.total_blocks() - config.free_blocks());
  EXPECT_LT(free_blocks, config.total_blocks());
  EXPECT_DOUBLE_EQ(value(e, "pagoda_kv_usage_ratio"), used_blocks / config.total_blocks());
  EXPECT_EQ(value(e, "pagoda_sequences"), static_cast<double>(server_->cache().num_sequences()));
  free_sequence(b);
  free_sequence(c);
  const Exposition emptied = scrape();
  ASSERT_TRUE(session_.config(config).ok());
  EXPECT_EQ(value(emptied, "pagoda_kv_blocks", {{"state", "free"}}), config.free_blocks());
}

TEST_F(ObservabilityTest, BuildInfoNamesTheBackend) {
  const Exposition e = scrape();
  const std::vector<testing::Sample> info = e.all("pagoda_build_info");
  ASSERT_EQ(info.size(), 1u);
  EXPECT_EQ(info[0].value, 1);
  EXPECT_EQ(info[0].labels.at("backend"), "cpu");
  EXPECT_EQ(info[0].labels.at("version"), PAGODA_VERSION);
  EXPECT_EQ(info[0].labels.at("device"), server_->backend().device_name());
}

TEST_F(ObservabilityTest, AForcedMismatchIsCountedAndLoggedAsAnError) {
  const uint64_t id = make_sequence(21);
  const Exposition before = scrape();
  server_->checker().set_perturbation_for_tests(flip_one_bit);
  v1::DecodeResponse response;
  ASSERT_TRUE(session_.decode(0, {id}, random_q(1), response).ok());
  server_->checker().wait_idle();
  server_->checker().set_perturbation_for_tests(nullptr);
  const Exposition after = scrape();

  EXPECT_EQ(delta(before, after, "pagoda_determinism_checks_total", kDeterministic), 1);
  EXPECT_EQ(delta(before, after, "pagoda_determinism_mismatches_total", kDeterministic), 1);
  EXPECT_GT(value(after, "pagoda_determinism_max_abs_diff", kDeterministic), 0);
  const std::string expected = "sequence_id=" + std::to_string(id) + " layer=0 length=21 chunk_tokens=16 splits=2";
  int logged = 0;
  for (const std::string& line : sink_->lines()) {
    if (line.find("\"level\":\"error\"") != std::string::npos && line.find("determinism mismatch") != std::string::npos &&
        line.find(expected) != std::string::npos && line.find("max_abs_diff=") != std::string::npos) {
      ++logged;
    }
  }
  EXPECT_EQ(logged, 1);
  free_sequence(id);
}

// The check reads the blocks pinned at the launch: freeing the sequence and
// overwriting every free block before the check runs must not change its result.
TEST_F(ObservabilityTest, AFreedAndReusedSequenceDoesNotDisturbItsPendingCheck) {
  const uint64_t blocker = make_sequence(8);
  const uint64_t id = make_sequence(37);
  const Exposition before = scrape();
  g_hold_checker = true;
  g_checker_held = false;
  server_->checker().set_perturbation_for_tests(hold_while_asked);
  v1::DecodeResponse response;
  ASSERT_TRUE(session_.decode(0, {blocker}, random_q(1), response).ok());
  while (!g_checker_held.load()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  // The checker is busy: this sequence's check waits in the queue with its prefix pinned.
  ASSERT_TRUE(session_.decode(0, {id}, random_q(1), response).ok());
  free_sequence(id);
  // Every free block now gets new contents (the freed sequence's would be among them).
  v1::GetConfigResponse config;
  ASSERT_TRUE(session_.config(config).ok());
  uint64_t filler = 0;
  ASSERT_TRUE(session_.create(filler).ok());
  const size_t n = static_cast<size_t>(config.free_blocks()) * g_.block_size * g_.num_kv_heads * g_.head_dim;
  ASSERT_TRUE(session_.append(filler, 0, random_values(rng_, n), random_values(rng_, n)).ok());
  server_->checker().set_perturbation_for_tests(nullptr);
  g_hold_checker = false;
  const Exposition after = scrape();

  EXPECT_EQ(delta(before, after, "pagoda_determinism_checks_total", kDeterministic), 2);
  EXPECT_EQ(delta(before, after, "pagoda_determinism_mismatches_total", kDeterministic), 0);
  free_sequence(filler);
  free_sequence(blocker);
}

TEST_F(ObservabilityTest, LogLinesAreJsonWithSummariesAndNoRequestLineAtInfo) {
  // At least one periodic summary (every 0.2 s here).
  const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  auto has_summary = [] {
    for (const std::string& line : sink_->lines())
      if (line.find("\"msg\":\"summary: ") != std::string::npos) return true;
    return false;
  };
  while (!has_summary() && std::chrono::steady_clock::now() < give_up)
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  EXPECT_TRUE(has_summary());

  const std::vector<std::string> lines = sink_->lines();
  ASSERT_FALSE(lines.empty());
  for (const std::string& line : lines) {
    std::map<std::string, std::string> fields;
    ASSERT_TRUE(parse_flat_json(line, fields)) << line;
    for (const char* key : {"time", "level", "thread", "msg"}) EXPECT_EQ(fields.count(key), 1u) << key << ": " << line;
    if (fields["level"] == "info") {
      // Lifecycle and summaries only: nothing per request or per sequence.
      EXPECT_EQ(line.find("request_id="), std::string::npos) << line;
      EXPECT_EQ(line.find("sequence_id="), std::string::npos) << line;
    }
  }
}

// Fast mode: splits adapt to the batch, so a re-check alone may differ in the last
// bits; every sequence is still checked once, and a difference is no error.
class FastModeCheckTest : public ServerTest {
 protected:
  ServerConfig config() const override {
    ServerConfig c = small_config();
    c.mode = "fast";
    c.determinism_sample_rate = 1;
    c.log_level = "debug";
    return c;
  }
};

TEST_F(FastModeCheckTest, EverySequenceIsCheckedAndNoDifferenceIsAnError) {
  auto sink = std::make_shared<CaptureSink>();
  auto previous = spdlog::default_logger();
  spdlog::set_default_logger(std::make_shared<spdlog::logger>("capture", sink));
  spdlog::set_level(spdlog::level::debug);
  const std::vector<uint64_t> ids{make_sequence(3), make_sequence(70), make_sequence(200), make_sequence(33)};
  for (int call = 0; call < 3; ++call) decode_checked(call % g_.num_layers, ids);
  server_->checker().wait_idle();
  const DeterminismChecker::Stats stats = server_->checker().stats();
  EXPECT_EQ(stats.checked, 3 * ids.size());
  EXPECT_EQ(stats.skipped, 0u);
  int mismatch_lines = 0;
  for (const std::string& line : sink->lines()) {
    if (line.find("determinism mismatch (fast mode)") == std::string::npos) continue;
    ++mismatch_lines;
    EXPECT_NE(line.find("debug"), std::string::npos) << line;
  }
  EXPECT_EQ(static_cast<uint64_t>(mismatch_lines), stats.mismatches);
  spdlog::set_default_logger(previous);
}

}  // namespace
}  // namespace pagoda::e2e
