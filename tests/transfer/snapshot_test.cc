// --snapshot-dir across an in-process restart: every sequence comes back with
// its id, tenant, label and bits; new ids are new; a bad file is skipped,
// named and counted; the files restored are gone.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <set>

#include "e2e_fixture.h"
#include "metrics/scrape.h"
#include "observability/metrics.h"
#include "transfer_support.h"

namespace pagoda::e2e {
namespace {

namespace fs = std::filesystem;

class SnapshotTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("pagoda-snapshot-" + std::to_string(::getpid()) + "-" +
                                        ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    tokens_ = dir_.string() + ".tokens";
    std::ofstream(tokens_) << "alice token-a\nbob token-b\n";
  }
  void TearDown() override {
    if (server_) server_->shutdown(0);
    server_.reset();
    fs::remove_all(dir_);
    fs::remove(tokens_);
  }

  ServerConfig config() const {
    ServerConfig c = small_config();
    c.snapshot_dir = dir_.string();
    c.auth_tokens = tokens_;
    return c;
  }
  void start(const ServerConfig& c) {
    server_ = start_server(c);
    stub_ = make_stub(*server_);
  }
  // Stops the server as SIGTERM does: drain, then the snapshot.
  void stop() {
    server_->shutdown(1);
    server_.reset();
  }
  const CacheGeometry& g() const { return server_->config().geometry; }

  grpc::Status call_create(const std::string& token, const std::string& label, uint64_t* id) {
    grpc::ClientContext ctx;
    ctx.AddMetadata("authorization", "Bearer " + token);
    v1::CreateSequenceRequest r;
    r.set_label(label);
    v1::CreateSequenceResponse out;
    grpc::Status s = stub_->CreateSequence(&ctx, r, &out);
    *id = out.sequence_id();
    return s;
  }
  void append(const std::string& token, uint64_t id, int32_t layer, int32_t tokens) {
    const size_t n = static_cast<size_t>(tokens) * g().num_kv_heads * g().head_dim;
    grpc::ClientContext ctx;
    ctx.AddMetadata("authorization", "Bearer " + token);
    v1::AppendKVRequest r;
    r.set_sequence_id(id);
    r.set_layer(layer);
    *r.mutable_k() = f32_tensor(random_values(rng_, n), {tokens, g().num_kv_heads, g().head_dim});
    *r.mutable_v() = f32_tensor(random_values(rng_, n), {tokens, g().num_kv_heads, g().head_dim});
    v1::AppendKVResponse out;
    ASSERT_TRUE(stub_->AppendKV(&ctx, r, &out).ok());
  }
  uint64_t make(const std::string& token, const std::string& label, int32_t tokens0, int32_t tokens1) {
    uint64_t id = 0;
    EXPECT_TRUE(call_create(token, label, &id).ok());
    append(token, id, 0, tokens0);
    append(token, id, 1, tokens1);
    return id;
  }
  grpc::Status get(const std::string& token, uint64_t id, v1::GetSequenceResponse* out) {
    grpc::ClientContext ctx;
    ctx.AddMetadata("authorization", "Bearer " + token);
    v1::GetSequenceRequest r;
    r.set_sequence_id(id);
    return stub_->GetSequence(&ctx, r, out);
  }
  std::string bytes(const std::string& token, uint64_t id) {
    grpc::Status s;
    std::string data = data_of(export_chunks(*stub_, id, {}, &s, token));
    EXPECT_TRUE(s.ok()) << s.error_message();
    return data;
  }
  double metric(const std::string& name, const testing::LabelSet& labels = {}) {
    std::vector<std::string> errors;
    const auto e = testing::parse_exposition(server_->metrics().exposition(), &errors);
    return e.value(name, labels).value_or(-1);
  }

  fs::path dir_;
  std::string tokens_;
  std::unique_ptr<PagodaServer> server_;
  std::unique_ptr<v1::DecodeAttention::Stub> stub_;
  std::mt19937 rng_{5};
};

TEST_F(SnapshotTest, SequencesSurviveARestart) {
  start(config());
  const uint64_t a1 = make("token-a", "alice-1", 13, 9);
  const uint64_t a2 = make("token-a", "", 4, 4);
  const uint64_t b1 = make("token-b", "bob-1", 30, 30);
  const std::string a1_bytes = bytes("token-a", a1);
  const std::string b1_bytes = bytes("token-b", b1);
  stop();
  ASSERT_TRUE(fs::exists(dir_ / "MANIFEST"));

  start(config());
  EXPECT_GT(metric("pagoda_snapshot_seconds", {{"phase", "restore"}}), 0);
  EXPECT_GT(metric("pagoda_snapshot_bytes_total", {{"phase", "restore"}}), a1_bytes.size() + b1_bytes.size());
  EXPECT_EQ(metric("pagoda_snapshot_restore_failures_total"), 0);
  v1::GetSequenceResponse info;
  ASSERT_TRUE(get("token-a", a1, &info).ok());
  EXPECT_EQ(info.label(), "alice-1");
  EXPECT_EQ(info.layer_lengths(0), 13);
  EXPECT_EQ(info.layer_lengths(1), 9);
  ASSERT_TRUE(get("token-a", a2, &info).ok());
  ASSERT_TRUE(get("token-b", b1, &info).ok());
  EXPECT_EQ(info.label(), "bob-1");
  // Tenants kept: each id is still only its owner's.
  EXPECT_EQ(get("token-b", a1, &info).error_code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_EQ(get("token-a", b1, &info).error_code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_EQ(bytes("token-a", a1), a1_bytes);
  EXPECT_EQ(bytes("token-b", b1), b1_bytes);
  // New ids never repeat the old ones (the permutation continues).
  std::set<uint64_t> seen = {a1, a2, b1};
  for (int i = 0; i < 50; ++i) {
    uint64_t id = 0;
    ASSERT_TRUE(call_create("token-b", "", &id).ok());
    EXPECT_TRUE(seen.insert(id).second) << id;
  }
  // What was restored is gone from the directory.
  for (const auto& entry : fs::directory_iterator(dir_)) ADD_FAILURE() << "left behind: " << entry.path();

  // A second restart writes and restores them all again (the new ones too).
  stop();
  start(config());
  ASSERT_TRUE(get("token-a", a1, &info).ok());
  EXPECT_EQ(bytes("token-a", a1), a1_bytes);
  EXPECT_EQ(server_->config().geometry.num_layers, 2);
}

TEST_F(SnapshotTest, CorruptTruncatedOrMismatchedFilesAreSkippedAndCounted) {
  start(config());
  const uint64_t good = make("token-a", "good", 12, 12);
  const uint64_t corrupt = make("token-a", "corrupt", 12, 12);
  const uint64_t cut = make("token-b", "cut", 12, 12);
  const std::string good_bytes = bytes("token-a", good);
  stop();
  auto file_of = [&](uint64_t id) {
    char name[64];
    std::snprintf(name, sizeof name, "seq-%016llx.pgkv", static_cast<unsigned long long>(id));
    return dir_ / name;
  };
  {
    std::fstream f(file_of(corrupt), std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(static_cast<std::streamoff>(fs::file_size(file_of(corrupt)) - 100));
    f.put('\x5a');
  }
  fs::resize_file(file_of(cut), fs::file_size(file_of(cut)) - 10);

  start(config());
  EXPECT_EQ(metric("pagoda_snapshot_restore_failures_total"), 2);
  v1::GetSequenceResponse info;
  ASSERT_TRUE(get("token-a", good, &info).ok());
  EXPECT_EQ(bytes("token-a", good), good_bytes);
  EXPECT_EQ(get("token-a", corrupt, &info).error_code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_EQ(get("token-b", cut, &info).error_code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_TRUE(fs::exists(file_of(corrupt).string() + ".failed"));
  EXPECT_TRUE(fs::exists(file_of(cut).string() + ".failed"));
  EXPECT_FALSE(fs::exists(file_of(good)));

  // A server of another geometry skips every file and still starts.
  stop();
  ServerConfig other = config();
  other.kv_heads = 4;
  start(other);
  EXPECT_EQ(metric("pagoda_snapshot_restore_failures_total"), 1);
  EXPECT_EQ(get("token-a", good, &info).error_code(), grpc::StatusCode::NOT_FOUND);
}

TEST_F(SnapshotTest, ACorruptManifestStartsEmpty) {
  start(config());
  make("token-a", "x", 3, 3);
  stop();
  std::ofstream(dir_ / "MANIFEST") << "pagoda-snapshot 1\nid_key zz\n";
  start(config());
  EXPECT_EQ(metric("pagoda_snapshot_restore_failures_total"), 1);
  uint64_t id = 0;
  EXPECT_TRUE(call_create("token-a", "", &id).ok());
}

}  // namespace
}  // namespace pagoda::e2e
