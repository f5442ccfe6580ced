// Under --auth-tokens: a token revoked by a reload (SIGHUP) fails its open
// DecodeStreams UNAUTHENTICATED from their next request, appends included,
// while other tenants' streams carry on; and reflection, which would answer
// without a token, is not served at all.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include <grpcpp/generic/generic_stub.h>

#include "e2e_fixture.h"
#include "pagoda/client/client.h"
#include "pagoda/client/decode_stream.h"

namespace pagoda::e2e {
namespace {

namespace fs = std::filesystem;
using client::ErrorCode;

class RevocationTest : public ::testing::Test {
 protected:
  void SetUp() override {
    tokens_ = fs::temp_directory_path() / ("pagoda-revocation-" + std::to_string(::getpid()) + "-" +
                                           ::testing::UnitTest::GetInstance()->current_test_info()->name());
    write_tokens("a token-of-a\nb token-of-b\n");
    ServerConfig c = small_config();
    c.auth_tokens = tokens_.string();
    server_ = start_server(c);
    ASSERT_NE(server_, nullptr);
  }
  void TearDown() override {
    if (server_) server_->shutdown(0);
    std::error_code ignored;
    fs::remove(tokens_, ignored);
  }
  void write_tokens(const std::string& text) { std::ofstream(tokens_, std::ios::binary) << text; }
  std::unique_ptr<client::Client> connect(const std::string& token) {
    client::ClientOptions o;
    o.timeout = std::chrono::seconds(5);
    o.token = token;
    return client::Client::connect("127.0.0.1:" + std::to_string(server_->port()), o);
  }
  const CacheGeometry& g() const { return server_->config().geometry; }
  std::vector<float> q() { return std::vector<float>(static_cast<size_t>(g().num_q_heads * g().head_dim), 0.25f); }
  std::vector<float> kv() { return std::vector<float>(static_cast<size_t>(g().num_kv_heads * g().head_dim), 0.5f); }

  fs::path tokens_;
  std::unique_ptr<PagodaServer> server_;
};

TEST_F(RevocationTest, ARevokedTokensOpenStreamFailsFromItsNextRequestOthersCarryOn) {
  auto a = connect("token-of-a");
  auto b = connect("token-of-b");
  auto sa = a->create_sequence("a");
  auto sb = b->create_sequence("b");
  ASSERT_TRUE(sa.ok() && sb.ok());
  auto stream_a = a->open_stream();
  auto stream_b = b->open_stream();
  ASSERT_TRUE(stream_a.ok() && stream_b.ok());
  const auto k = kv(), v = kv();
  ASSERT_TRUE((*stream_a)->call({.layer = 0, .sequence_ids = {*sa}, .q = q(), .k = k, .v = v}).ok());
  ASSERT_TRUE((*stream_b)->call({.layer = 0, .sequence_ids = {*sb}, .q = q(), .k = k, .v = v}).ok());

  write_tokens("b token-of-b\n");  // a's token revoked
  ASSERT_TRUE(server_->reload_auth().ok());
  for (int i = 0; i < 3; ++i) {
    auto r = (*stream_a)->call({.layer = 0, .sequence_ids = {*sa}, .q = q(), .k = k, .v = v});
    ASSERT_FALSE(r.ok()) << "request " << i << " after the revocation was served";
    EXPECT_EQ(r.error().code(), ErrorCode::kUnauthenticated);
    EXPECT_EQ(r.error().message(), "authorization: unknown or revoked token");
  }
  auto rb = (*stream_b)->call({.layer = 0, .sequence_ids = {*sb}, .q = q(), .k = k, .v = v});
  ASSERT_TRUE(rb.ok()) << rb.error().to_string();
  EXPECT_EQ(rb->lengths[0], 2);
  // A token put back works again on the same stream, and nothing was appended
  // for a meanwhile: its sequence holds its one token.
  write_tokens("a token-of-a\nb token-of-b\n");
  ASSERT_TRUE(server_->reload_auth().ok());
  auto back = (*stream_a)->call({.layer = 0, .sequence_ids = {*sa}, .q = q()});
  ASSERT_TRUE(back.ok()) << back.error().to_string();
  EXPECT_EQ(back->lengths[0], 1);
  auto info = a->get_sequence(*sa);
  ASSERT_TRUE(info.ok()) << info.error().to_string();
  EXPECT_EQ(info->layer_lengths[0], 1);
}

// grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo asking
// list_services, with `token` as a bearer token (empty: none); the call's
// status, and the response's bytes in *listing.
grpc::Status reflect(int port, const std::string& token, std::string* listing) {
  grpc::GenericStub stub(grpc::CreateChannel("127.0.0.1:" + std::to_string(port), grpc::InsecureChannelCredentials()));
  grpc::CompletionQueue cq;
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
  if (!token.empty()) ctx.AddMetadata("authorization", "Bearer " + token);
  auto call = stub.PrepareCall(&ctx, "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo", &cq);
  void* tag = nullptr;
  bool ok = false;
  intptr_t next = 0;
  auto step = [&] {
    EXPECT_TRUE(cq.Next(&tag, &ok));
    return ok;
  };
  call->StartCall(reinterpret_cast<void*>(++next));
  step();
  grpc::Slice request(std::string("\x3a\x00", 2));  // list_services: ""
  call->Write(grpc::ByteBuffer(&request, 1), reinterpret_cast<void*>(++next));
  step();
  grpc::ByteBuffer response;
  call->Read(&response, reinterpret_cast<void*>(++next));
  if (step()) {
    std::vector<grpc::Slice> slices;
    if (response.Dump(&slices).ok())
      for (const auto& s : slices) listing->append(reinterpret_cast<const char*>(s.begin()), s.size());
  }
  call->WritesDone(reinterpret_cast<void*>(++next));
  step();
  grpc::Status status;
  call->Finish(&status, reinterpret_cast<void*>(++next));
  step();
  return status;
}

TEST_F(RevocationTest, ReflectionIsNotServedUnderAuthWithOrWithoutAToken) {
  for (const std::string token : {"", "token-of-c", "token-of-a"}) {
    std::string listing;
    const grpc::Status s = reflect(server_->port(), token, &listing);
    EXPECT_EQ(s.error_code(), grpc::UNIMPLEMENTED) << "token '" << token << "': " << s.error_message();
    EXPECT_EQ(listing.find("pagoda.v1.DecodeAttention"), std::string::npos) << "token '" << token << "'";
  }
}

// The same process serves reflection to a server without auth: the switch is per server.
TEST(ReflectionWithoutAuth, IsServedToAnyone) {
  auto server = start_server(small_config());
  ASSERT_NE(server, nullptr);
  std::string listing;
  EXPECT_TRUE(reflect(server->port(), "", &listing).ok());
  EXPECT_NE(listing.find("pagoda.v1.DecodeAttention"), std::string::npos);
  server->shutdown(0);
}

}  // namespace
}  // namespace pagoda::e2e
