// The metrics port under --auth-tokens: it carries no tenant name or usage
// unless --metrics-tenant-labels says so, and with --metrics-auth it answers
// only HTTP basic auth with the file's credentials.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "e2e_fixture.h"
#include "metrics/scrape.h"
#include "observability/metrics.h"
#include "pagoda/client/client.h"

namespace pagoda::e2e {
namespace {

namespace fs = std::filesystem;

class MetricsPrivacyTest : public ::testing::Test {
 protected:
  void TearDown() override {
    if (server_) server_->shutdown(0);
    std::error_code ignored;
    fs::remove_all(dir(), ignored);
  }
  static fs::path dir() {
    return fs::temp_directory_path() / ("pagoda-metrics-privacy-" + std::to_string(::getpid()) + "-" +
                                        ::testing::UnitTest::GetInstance()->current_test_info()->name());
  }
  // An auth server serving /metrics; `metrics_auth`: the --metrics-auth file's text (empty: none).
  void start(bool tenant_labels, const std::string& metrics_auth) {
    fs::create_directories(dir());
    std::ofstream(dir() / "tokens") << "acme token-of-acme\n";
    ServerConfig c = small_config();
    c.auth_tokens = (dir() / "tokens").string();
    c.metrics_address = "127.0.0.1:0";
    c.metrics_tenant_labels = tenant_labels;
    if (!metrics_auth.empty()) {
      std::ofstream(dir() / "metrics-auth") << metrics_auth;
      c.metrics_auth = (dir() / "metrics-auth").string();
    }
    server_ = start_server(c);
    ASSERT_NE(server_, nullptr);
    client::ClientOptions o;
    o.token = "token-of-acme";
    auto acme = client::Client::connect("127.0.0.1:" + std::to_string(server_->port()), o);
    ASSERT_TRUE(acme->create_sequence("x").ok());
    ASSERT_TRUE(acme->refresh_config().ok());
  }
  int metrics_port() const { return server_->metrics().port(); }

  std::unique_ptr<PagodaServer> server_;
};

TEST_F(MetricsPrivacyTest, NoTenantNameOrUsageUnlessAskedFor) {
  start(false, "");
  const testing::HttpReply r = testing::http_get_loopback(metrics_port(), "/metrics");
  ASSERT_EQ(r.status, 200) << r.error;
  EXPECT_EQ(r.body.find("acme"), std::string::npos) << "a tenant name is on the open metrics port";
  EXPECT_EQ(r.body.find("tenant=\""), std::string::npos);
  EXPECT_NE(r.body.find("pagoda_build_info"), std::string::npos);
}

TEST_F(MetricsPrivacyTest, TenantSeriesWithTheFlag) {
  start(true, "");
  const testing::HttpReply r = testing::http_get_loopback(metrics_port(), "/metrics");
  ASSERT_EQ(r.status, 200) << r.error;
  std::vector<std::string> errors;
  const testing::Exposition e = testing::parse_exposition(r.body, &errors);
  EXPECT_EQ(e.value("pagoda_tenant_requests_total", {{"tenant", "acme"}}), 2);
  EXPECT_EQ(e.value("pagoda_tenant_sequences", {{"tenant", "acme"}}), 1);
}

TEST_F(MetricsPrivacyTest, BasicAuthOnTheMetricsPort) {
  start(false, "prometheus:s3cret\n");
  EXPECT_EQ(testing::http_get_loopback(metrics_port(), "/metrics").status, 401);
  EXPECT_EQ(testing::http_get_loopback(metrics_port(), "/metrics", "prometheus:wrong").status, 401);
  EXPECT_EQ(testing::http_get_loopback(metrics_port(), "/metrics", "other:s3cret").status, 401);
  const testing::HttpReply r = testing::http_get_loopback(metrics_port(), "/metrics", "prometheus:s3cret");
  ASSERT_EQ(r.status, 200) << r.error;
  EXPECT_NE(r.body.find("pagoda_build_info"), std::string::npos);
}

TEST(MetricsAuthFile, AMalformedFileFailsAtStartNamingTheFlagNotThePassword) {
  const fs::path path = fs::temp_directory_path() / ("pagoda-metrics-auth-" + std::to_string(::getpid()));
  std::ofstream(path) << "no-colon-s3cret\n";
  ServerConfig c = small_config();
  c.metrics_auth = path.string();
  const StatusOr<EffectiveConfig> e = resolve_config(c);
  ASSERT_FALSE(e.ok());
  EXPECT_EQ(e.status().message(), "--metrics-auth: expected one line 'USER:PASSWORD' (both non-empty) in '" +
                                      path.string() + "', received another form");
  fs::remove(path);
}

}  // namespace
}  // namespace pagoda::e2e
