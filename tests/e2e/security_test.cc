// Tenants, tokens, TLS and mTLS end to end (docs/design.md §10), through the C++
// client over loopback. Certificates are made with openssl at test time in a
// temporary folder: a CA, a server certificate for 127.0.0.1 and localhost,
// and a client certificate signed by the same CA.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>

#include "app/server_config.h"
#include "e2e_fixture.h"
#include "observability/metrics.h"
#include "pagoda/client/client.h"

namespace pagoda::e2e {
namespace {

namespace fs = std::filesystem;
using client::ErrorCode;

std::string read_file(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

void write_file(const fs::path& p, const std::string& text) { std::ofstream(p, std::ios::binary) << text; }

// The CA, server and client certificates, made once for the suite.
class Certificates {
 public:
  static const Certificates& get() {
    static const Certificates certs;
    return certs;
  }
  fs::path dir;
  bool ok = false;

  std::string pem(const char* name) const { return read_file(dir / name); }
  ~Certificates() {
    std::error_code ignored;
    fs::remove_all(dir, ignored);
  }

 private:
  Certificates() {
    dir = fs::temp_directory_path() / ("pagoda-certs-" + std::to_string(::getpid()));
    fs::create_directories(dir);
    const std::string d = dir.string();
    const std::string script =
        "cd '" + d + "' && "
        "openssl req -x509 -newkey rsa:2048 -nodes -keyout ca.key -out ca.pem -days 2 -subj /CN=pagoda-test-ca && "
        "openssl req -newkey rsa:2048 -nodes -keyout server.key -out server.csr -subj /CN=localhost && "
        "printf 'subjectAltName=IP:127.0.0.1,DNS:localhost\\n' > server.ext && "
        "openssl x509 -req -in server.csr -CA ca.pem -CAkey ca.key -CAcreateserial -out server.pem -days 2 "
        "-extfile server.ext && "
        "openssl req -newkey rsa:2048 -nodes -keyout client.key -out client.csr -subj /CN=pagoda-test-client && "
        "openssl x509 -req -in client.csr -CA ca.pem -CAkey ca.key -CAcreateserial -out client.pem -days 2 "
        ">/dev/null 2>&1";
    ok = std::system(("(" + script + ") >/dev/null 2>&1").c_str()) == 0;
  }
};

class SecurityTest : public ::testing::Test {
 protected:
  void TearDown() override {
    if (server_) server_->shutdown(0);
  }
  // A plaintext or TLS server with tokens for tenants a (2 sequences at most)
  // and b (8 blocks at most).
  void start(bool tls, bool mutual) {
    ServerConfig c = small_config();
    tokens_ = Certificates::get().dir / ("tokens-" + std::to_string(++files_));
    write_file(tokens_, "# tenant token [quotas]\n"
                        "a token-of-a max_sequences=2\n"
                        "\n"
                        "b token-of-b max_blocks=8   # a comment\n");
    c.auth_tokens = tokens_.string();
    c.metrics_tenant_labels = true;  // the quota test reads the per-tenant series
    if (tls) {
      const fs::path dir = Certificates::get().dir;
      c.tls_cert = (dir / "server.pem").string();
      c.tls_key = (dir / "server.key").string();
      if (mutual) c.tls_client_ca = (dir / "ca.pem").string();
    }
    server_ = start_server(c);
    address_ = "127.0.0.1:" + std::to_string(server_->port());
  }
  std::unique_ptr<client::Client> connect(const std::string& token, bool tls = false, bool client_cert = false) {
    client::ClientOptions o;
    o.timeout = std::chrono::seconds(5);
    o.token = token;
    o.tls = tls;
    if (tls) o.tls_root_certs = Certificates::get().pem("ca.pem");
    if (client_cert) {
      o.tls_cert_chain = Certificates::get().pem("client.pem");
      o.tls_private_key = Certificates::get().pem("client.key");
    }
    return client::Client::connect(address_, o);
  }
  std::vector<float> kv(size_t tokens) {
    return std::vector<float>(tokens * static_cast<size_t>(g().num_kv_heads * g().head_dim), 0.5f);
  }
  std::vector<float> q() { return std::vector<float>(static_cast<size_t>(g().num_q_heads * g().head_dim), 0.25f); }
  const CacheGeometry& g() const { return server_->config().geometry; }

  std::unique_ptr<PagodaServer> server_;
  std::string address_;
  fs::path tokens_;
  int files_ = 0;
};

// The message with the id it names replaced, so that two messages about
// different ids can be compared.
std::string without_id(std::string message, uint64_t id) {
  const std::string digits = std::to_string(id);
  for (size_t at; (at = message.find(digits)) != std::string::npos;) message.replace(at, digits.size(), "ID");
  return message;
}

TEST_F(SecurityTest, CallsWithoutAValidTokenAreUnauthenticatedEverywhereButHealth) {
  start(false, false);
  for (const std::string token : {"", "token-of-c", "token-of-a2"}) {
    auto c = connect(token);
    auto config = c->refresh_config();
    ASSERT_FALSE(config.ok()) << "token '" << token << "'";
    EXPECT_EQ(config.error().code(), ErrorCode::kUnauthenticated);
    EXPECT_EQ(config.error().message().find("token-of"), std::string::npos) << "the token is echoed";
    auto created = c->create_sequence("x");
    ASSERT_FALSE(created.ok());
    EXPECT_EQ(created.error().code(), ErrorCode::kUnauthenticated);
    auto info = c->get_sequence(12345);
    ASSERT_FALSE(info.ok());
    EXPECT_EQ(info.error().code(), ErrorCode::kUnauthenticated);
    // The health service stays open: Kubernetes' gRPC probes send no metadata.
    auto health = c->health();
    ASSERT_TRUE(health.ok()) << health.error().to_string();
    EXPECT_EQ(*health, client::ServingStatus::kServing);
  }
  // DecodeStream: refused before any request is read.
  auto a = connect("token-of-a");
  auto id = a->create_sequence();
  ASSERT_TRUE(id.ok());
  auto stranger = connect("");
  auto stream = stranger->open_stream();
  ASSERT_FALSE(stream.ok() && (*stream)->call({.layer = 0, .sequence_ids = {*id}, .q = q()}).ok());
  EXPECT_EQ(server_->metrics().exposition().find("pagoda_auth_failures_total{reason=\"missing\"} 0\n"),
            std::string::npos);
}

TEST_F(SecurityTest, ARevokedTokenFailsFromTheNextCallAfterAReload) {
  start(false, false);
  auto a = connect("token-of-a");
  ASSERT_TRUE(a->refresh_config().ok());
  auto id = a->create_sequence("kept");
  ASSERT_TRUE(id.ok());
  write_file(tokens_, "a token-of-a-rotated max_sequences=2\nb token-of-b max_blocks=8\n");
  ASSERT_TRUE(server_->reload_auth().ok());
  auto old = a->get_sequence(*id);
  ASSERT_FALSE(old.ok());
  EXPECT_EQ(old.error().code(), ErrorCode::kUnauthenticated);
  // The tenant, not the token, owns the sequence: the new token reaches it.
  auto rotated = connect("token-of-a-rotated");
  auto info = rotated->get_sequence(*id);
  ASSERT_TRUE(info.ok()) << info.error().to_string();
  EXPECT_EQ(info->label, "kept");
  // A malformed file is refused and the tokens in force stay.
  write_file(tokens_, "a\n");
  const Status bad = server_->reload_auth();
  EXPECT_FALSE(bad.ok());
  EXPECT_NE(bad.message().find("line 1"), std::string::npos) << bad.message();
  EXPECT_TRUE(rotated->get_sequence(*id).ok());
}

TEST_F(SecurityTest, AnotherTenantsIdsAreNotFoundLikeUnknownOnesAndChangeNothing) {
  start(false, false);
  auto a = connect("token-of-a");
  auto b = connect("token-of-b");
  auto id = a->create_sequence("secret label");
  ASSERT_TRUE(id.ok());
  ASSERT_TRUE(a->append_kv(*id, 0, kv(5), kv(5)).ok());
  auto own = b->create_sequence("b's");
  ASSERT_TRUE(own.ok());
  auto before = a->decode({.layer = 0, .sequence_ids = {*id}, .q = q()});
  ASSERT_TRUE(before.ok());

  // An id nobody holds, for the messages to compare against.
  uint64_t unknown = *id ^ 0x5A5A5A5A5A5A5A5Aull;
  auto expect_same = [&](const client::Error& theirs, const client::Error& none, const char* what) {
    EXPECT_EQ(theirs.code(), ErrorCode::kNotFound) << what;
    EXPECT_EQ(without_id(theirs.message(), *id), without_id(none.message(), unknown)) << what;
  };
  expect_same(b->get_sequence(*id).error(), b->get_sequence(unknown).error(), "GetSequence");
  expect_same(b->append_kv(*id, 0, kv(1), kv(1)).error(), b->append_kv(unknown, 0, kv(1), kv(1)).error(),
              "AppendKV");
  expect_same(b->decode({.layer = 0, .sequence_ids = {*own, *id}, .q = std::vector<float>(2 * q().size(), 0.f)})
                  .error(),
              b->decode({.layer = 0, .sequence_ids = {*own, unknown}, .q = std::vector<float>(2 * q().size(), 0.f)})
                  .error(),
              "Decode in a batch");
  expect_same(b->fork_sequence(*id).error(), b->fork_sequence(unknown).error(), "ForkSequence");
  expect_same(b->truncate_sequence(*id, 1).error(), b->truncate_sequence(unknown, 1).error(), "TruncateSequence");
  expect_same(b->free_sequence(*id).error(), b->free_sequence(unknown).error(), "FreeSequence");
  auto stream = b->open_stream();
  ASSERT_TRUE(stream.ok());
  auto streamed = (*stream)->call({.layer = 0, .sequence_ids = {*id}, .q = q()});
  ASSERT_FALSE(streamed.ok());
  EXPECT_EQ(streamed.error().code(), ErrorCode::kNotFound);

  // a's sequence is as it was.
  auto info = a->get_sequence(*id);
  ASSERT_TRUE(info.ok());
  EXPECT_EQ(info->label, "secret label");
  EXPECT_EQ(info->layer_lengths[0], 5);
  auto after = a->decode({.layer = 0, .sequence_ids = {*id}, .q = q()});
  ASSERT_TRUE(after.ok());
  EXPECT_EQ(after->output, before->output);
}

TEST_F(SecurityTest, IdsAreDistinctNonZeroAndNotNeighbours) {
  start(false, false);
  auto b = connect("token-of-b");
  std::set<uint64_t> seen;
  uint64_t previous = 0;
  for (int i = 0; i < 200; ++i) {
    auto id = b->create_sequence();
    ASSERT_TRUE(id.ok()) << id.error().to_string();
    EXPECT_NE(*id, 0u);
    EXPECT_TRUE(seen.insert(*id).second) << "id " << *id << " handed out twice";
    if (previous != 0) {
      const uint64_t gap = *id > previous ? *id - previous : previous - *id;
      EXPECT_GT(gap, uint64_t{1} << 20) << previous << " then " << *id;
    }
    previous = *id;
    ASSERT_TRUE(b->free_sequence(*id).ok());
  }
}

TEST_F(SecurityTest, QuotasRefuseNamingThemAndOneTenantAtItsQuotaDoesNotStopAnother) {
  start(false, false);
  auto a = connect("token-of-a");
  auto b = connect("token-of-b");
  ASSERT_TRUE(a->create_sequence().ok());
  auto second = a->create_sequence();
  ASSERT_TRUE(second.ok());
  auto third = a->create_sequence();
  ASSERT_FALSE(third.ok());
  EXPECT_EQ(third.error().code(), ErrorCode::kResourceExhausted);
  EXPECT_NE(third.error().message().find("tenant 'a': expected at most 2 sequences (its max_sequences quota), "
                                         "it holds 2"),
            std::string::npos)
      << third.error().message();
  auto fork = a->fork_sequence(*second);
  ASSERT_FALSE(fork.ok());
  EXPECT_EQ(fork.error().code(), ErrorCode::kResourceExhausted);
  // b: 8 blocks of 4 tokens. 28 tokens take 7; 8 more would take 2 more.
  auto id = b->create_sequence();
  ASSERT_TRUE(id.ok());
  ASSERT_TRUE(b->append_kv(*id, 0, kv(28), kv(28)).ok());
  auto over = b->append_kv(*id, 0, kv(8), kv(8));
  ASSERT_FALSE(over.ok());
  EXPECT_EQ(over.error().code(), ErrorCode::kResourceExhausted);
  EXPECT_NE(over.error().message().find("tenant 'b': expected at most 8 blocks (its max_blocks quota), it holds 7"),
            std::string::npos)
      << over.error().message();
  EXPECT_EQ(b->get_sequence(*id)->layer_lengths[0], 28) << "a refused append changed nothing";
  auto config = b->refresh_config();
  ASSERT_TRUE(config.ok());
  EXPECT_EQ(config->tenant, "b");
  EXPECT_EQ(config->tenant_max_blocks, 8);
  EXPECT_EQ(config->tenant_blocks, 7);
  EXPECT_EQ(config->tenant_sequences, 1);
  EXPECT_TRUE(config->auth);
  // a at its sequence quota; b still creates.
  EXPECT_TRUE(b->create_sequence().ok());
  ASSERT_TRUE(a->free_sequence(*second).ok());
  EXPECT_TRUE(a->create_sequence().ok()) << "a freed one, so it may create one again";
  // Per-tenant series, labelled by tenant name only.
  const std::string text = server_->metrics().exposition();
  EXPECT_NE(text.find("pagoda_tenant_sequences{tenant=\"a\"} 2\n"), std::string::npos) << text;
  EXPECT_NE(text.find("pagoda_tenant_sequences{tenant=\"b\"} 2\n"), std::string::npos);
  EXPECT_NE(text.find("pagoda_tenant_kv_blocks{tenant=\"b\"} 7\n"), std::string::npos);
  EXPECT_NE(text.find("pagoda_tenant_requests_total{tenant=\"a\"}"), std::string::npos);
  EXPECT_EQ(text.find("token-of"), std::string::npos) << "a token in the metrics";
}

TEST_F(SecurityTest, TlsServerRefusesPlaintextAndServesTls) {
  ASSERT_TRUE(Certificates::get().ok) << "openssl could not make the test certificates";
  start(true, false);
  auto plain = connect("token-of-a");
  auto refused = plain->refresh_config();
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.error().code(), ErrorCode::kUnavailable);
  auto secure = connect("token-of-a", true);
  auto config = secure->refresh_config();
  ASSERT_TRUE(config.ok()) << config.error().to_string();
  EXPECT_TRUE(config->tls);
  EXPECT_EQ(config->tenant, "a");
}

TEST_F(SecurityTest, MutualTlsRequiresAClientCertificate) {
  ASSERT_TRUE(Certificates::get().ok) << "openssl could not make the test certificates";
  start(true, true);
  auto anonymous = connect("token-of-a", true, false);
  EXPECT_FALSE(anonymous->refresh_config().ok());
  auto known = connect("token-of-a", true, true);
  auto config = known->refresh_config();
  ASSERT_TRUE(config.ok()) << config.error().to_string();
  auto id = known->create_sequence();
  EXPECT_TRUE(id.ok());
}

TEST(GlobalLimits, SequencesAndTokensPerSequenceRefuseNamingTheFlagAndChangeNothing) {
  ServerConfig c = small_config();
  c.max_sequences = 3;
  c.max_sequence_tokens = 10;
  auto server = start_server(c);
  auto cl = client::Client::connect("127.0.0.1:" + std::to_string(server->port()));
  const CacheGeometry& g = server->config().geometry;
  const std::vector<float> row(static_cast<size_t>(g.num_kv_heads * g.head_dim), 0.5f);
  std::vector<float> eight(8 * row.size(), 0.5f), three(3 * row.size(), 0.5f);
  auto a = cl->create_sequence();
  ASSERT_TRUE(a.ok());
  ASSERT_TRUE(cl->create_sequence().ok());
  ASSERT_TRUE(cl->fork_sequence(*a).ok());
  auto fourth = cl->create_sequence();
  ASSERT_FALSE(fourth.ok());
  EXPECT_EQ(fourth.error().code(), ErrorCode::kResourceExhausted);
  EXPECT_NE(fourth.error().message().find("expected at most 3 sequences (--max-sequences), it holds 3"),
            std::string::npos)
      << fourth.error().message();
  ASSERT_TRUE(cl->append_kv(*a, 0, eight, eight).ok());
  auto over = cl->append_kv(*a, 0, three, three);
  ASSERT_FALSE(over.ok());
  EXPECT_EQ(over.error().code(), ErrorCode::kResourceExhausted);
  EXPECT_NE(over.error().message().find("expected at most 10 tokens in a layer (--max-sequence-tokens), the "
                                        "append would make 11"),
            std::string::npos)
      << over.error().message();
  EXPECT_EQ(cl->get_sequence(*a)->layer_lengths[0], 8);
  auto config = cl->refresh_config();
  ASSERT_TRUE(config.ok());
  EXPECT_EQ(config->tenant, "default");
  EXPECT_FALSE(config->auth);
  server->shutdown(0);
}

TEST(SecuritySettings, BadFilesFailAtStartNamingThePathAndTheReason) {
  ServerConfig c = small_config();
  c.tls_cert = "/nonexistent/server.pem";
  c.tls_key = "/nonexistent/server.key";
  auto r = resolve_config(c);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("--tls-cert: cannot read '/nonexistent/server.pem'"), std::string::npos)
      << r.status().message();
  c = small_config();
  c.tls_cert = "/etc/hostname";
  c.tls_key = "/etc/hostname";
  r = resolve_config(c);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("expected a certificate in PEM form"), std::string::npos);
  c = small_config();
  c.tls_key = "/etc/hostname";
  r = resolve_config(c);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("expected both or neither"), std::string::npos);

  const fs::path tokens = fs::temp_directory_path() / ("pagoda-tokens-" + std::to_string(::getpid()));
  c = small_config();
  c.auth_tokens = tokens.string();
  const std::pair<const char*, const char*> bad[] = {
      {"a t1\nb\n", "line 2: expected 'TENANT TOKEN"},
      {"a t1\nb t1\n", "line 2: token: expected each token once, received the token of line 1 again"},
      {"a t1 max_blocks=x\n", "line 1: max_blocks: expected an integer >= 0, received 'x'"},
      {"a t1 colour=blue\n", "line 1: expected max_blocks=N or max_sequences=N, received 'colour=blue'"},
      {"a t1 max_blocks=3\na t2 max_blocks=4\n", "line 2: max_blocks: expected the value tenant 'a' has"},
      {"a/b t1\n", "line 1: tenant: expected 1 to 64 of [A-Za-z0-9._-], received 'a/b'"},
      {"# nothing\n\n", "expected at least one token"},
  };
  for (const auto& [text, want] : bad) {
    write_file(tokens, text);
    r = resolve_config(c);
    ASSERT_FALSE(r.ok()) << text;
    EXPECT_NE(r.status().message().find(want), std::string::npos) << r.status().message();
    EXPECT_EQ(r.status().message().find("t1"), std::string::npos) << "a token in a message: " << r.status().message();
  }
  fs::remove(tokens);
}

}  // namespace
}  // namespace pagoda::e2e
