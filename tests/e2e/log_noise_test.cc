// What the log says about calls a client can make fail at will: a valid
// request cut off by its deadline while still arriving is not "cannot parse",
// and failed authentications are rate-limited in the log while the metric
// counts every one.
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>

#include <spdlog/spdlog.h>

#include "capture_sink.h"
#include "e2e_fixture.h"
#include "metrics/scrape.h"
#include "observability/metrics.h"

namespace pagoda::e2e {
namespace {

namespace fs = std::filesystem;

class LogNoiseTest : public ::testing::Test {
 protected:
  void SetUp() override {
    sink_ = std::make_shared<CaptureSink>();
    spdlog::set_default_logger(std::make_shared<spdlog::logger>("capture", sink_));
  }
  void TearDown() override {
    if (server_) server_->shutdown(0);
    spdlog::set_default_logger(std::make_shared<spdlog::logger>("", spdlog::sinks_init_list{}));
  }
  ServerConfig config() const {
    ServerConfig c = small_config();
    c.log_level = "debug";
    return c;
  }

  std::shared_ptr<CaptureSink> sink_;
  std::unique_ptr<PagodaServer> server_;
};

TEST_F(LogNoiseTest, ARequestCutOffByItsDeadlineWhileArrivingIsNotLoggedAsUnparsable) {
  server_ = start_server(config());
  ASSERT_NE(server_, nullptr);
  auto stub = make_stub(*server_);
  // 8 MiB of q: long enough on the wire for a few-millisecond deadline to pass first.
  v1::DecodeRequest big;
  big.set_layer(0);
  big.add_sequence_ids(1);
  big.mutable_q()->set_dtype(v1::FLOAT32);
  big.mutable_q()->mutable_data()->assign(8 << 20, '\0');
  // Deadlines from 1 ms up, until one passed while the message was arriving
  // (a slow build, a sanitizer's, cuts the short ones before the handler runs).
  constexpr const char* kArriving = "the deadline passed while the request message was arriving";
  int cut = 0;
  for (int ms = 1; ms <= 300 && sink_->count(kArriving) == 0; ms += ms < 30 ? 1 : 10) {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::milliseconds(ms));
    v1::DecodeResponse r;
    cut += stub->Decode(&ctx, big, &r).error_code() == grpc::DEADLINE_EXCEEDED;
  }
  ASSERT_GT(cut, 0);
  // The server is done with them once an unrelated call has been answered.
  Session session{stub.get(), server_->config().geometry};
  v1::GetConfigResponse c;
  ASSERT_TRUE(session.config(c).ok());
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  EXPECT_EQ(sink_->count("cannot parse"), 0) << "a request cut off by its deadline was logged as unparsable";
  // The case arose: some request was cut off while arriving (and said so at debug).
  EXPECT_GT(sink_->count(kArriving), 0) << cut;
}

TEST_F(LogNoiseTest, FailedAuthenticationsAreRateLimitedInTheLogAndCountedExactly) {
  const fs::path tokens = fs::temp_directory_path() / ("pagoda-log-noise-" + std::to_string(::getpid()));
  std::ofstream(tokens) << "a token-of-a\n";
  ServerConfig c = config();
  c.log_level = "warn";
  c.auth_tokens = tokens.string();
  server_ = start_server(c);
  ASSERT_NE(server_, nullptr);
  auto stub = make_stub(*server_);
  constexpr int kCalls = 300;
  const auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < kCalls; ++i) {
    grpc::ClientContext ctx;
    ctx.AddMetadata("authorization", "Bearer not-a-token");
    v1::GetConfigResponse r;
    ASSERT_EQ(stub->GetConfig(&ctx, v1::GetConfigRequest(), &r).error_code(), grpc::UNAUTHENTICATED);
  }
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const int logged = sink_->count("UNAUTHENTICATED");
  EXPECT_GE(logged, 1);
  EXPECT_LE(logged, 5 * static_cast<int>(std::ceil(seconds) + 1)) << "in " << seconds << " s";
  std::vector<std::string> errors;
  const auto e = testing::parse_exposition(server_->metrics().exposition(), &errors);
  EXPECT_EQ(e.value("pagoda_auth_failures_total", {{"reason", "unknown"}}), kCalls);
  fs::remove(tokens);
}

}  // namespace
}  // namespace pagoda::e2e
