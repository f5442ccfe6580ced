// The client against a scripted in-process server: typed calls, errors and
// deadlines as the server produces them, DecodeStream's request_id matching and
// per-request errors, and the health check.
#include <chrono>
#include <memory>
#include <thread>
#include <vector>

#include <grpcpp/grpcpp.h>
#include <grpcpp/health_check_service_interface.h>
#include <gtest/gtest.h>

#include "pagoda/client/client.h"
#include "pagoda/client/tensor.h"
#include "pagoda/v1/decode_attention.grpc.pb.h"

namespace pagoda::client {
namespace {

// Layers that script the fake server's behaviour.
constexpr int32_t kSlowLayer = 99;      // answers after 500 ms
constexpr int32_t kFailLayer = 98;      // NOT_FOUND (unary) / DecodeError (stream)
constexpr int32_t kWrongIdLayer = 97;   // stream: answers with another request_id

// Echoes q as the output (same dtype and bytes): a response the test can tie to
// its request without any attention math.
class ScriptedService final : public v1::DecodeAttention::Service {
 public:
  grpc::Status GetConfig(grpc::ServerContext*, const v1::GetConfigRequest*,
                         v1::GetConfigResponse* resp) override {
    resp->set_num_layers(2);
    resp->set_num_q_heads(4);
    resp->set_num_kv_heads(2);
    resp->set_head_dim(8);
    resp->set_block_size(16);
    resp->set_cache_dtype(v1::FLOAT16);
    resp->set_backend("scripted");
    return grpc::Status::OK;
  }

  grpc::Status Decode(grpc::ServerContext*, const v1::DecodeRequest* req,
                      v1::DecodeResponse* resp) override {
    if (req->layer() == kSlowLayer) std::this_thread::sleep_for(std::chrono::milliseconds(500));
    if (req->layer() == kFailLayer)
      return {grpc::StatusCode::NOT_FOUND, "sequence_ids[0]: unknown sequence 5"};
    echo(*req, *resp);
    return grpc::Status::OK;
  }

  grpc::Status DecodeStream(grpc::ServerContext*,
                            grpc::ServerReaderWriter<v1::DecodeResponse, v1::DecodeRequest>* stream) override {
    v1::DecodeRequest req;
    while (stream->Read(&req)) {
      v1::DecodeResponse resp;
      if (req.layer() == kFailLayer) {
        resp.set_request_id(req.request_id());
        resp.mutable_error()->set_code(grpc::StatusCode::NOT_FOUND);
        resp.mutable_error()->set_message("sequence_ids[0]: unknown sequence 5");
      } else {
        echo(req, resp);
        if (req.layer() == kWrongIdLayer) resp.set_request_id(req.request_id() + 1000);
      }
      if (!stream->Write(resp)) break;
    }
    return grpc::Status::OK;
  }

 private:
  static void echo(const v1::DecodeRequest& req, v1::DecodeResponse& resp) {
    resp.set_request_id(req.request_id());
    *resp.mutable_output() = req.q();
    for (int i = 0; i < req.sequence_ids_size(); ++i) resp.add_lengths(10 + i);
  }
};

class SessionTest : public ::testing::Test {
 protected:
  void SetUp() override {
    grpc::EnableDefaultHealthCheckService(true);
    grpc::ServerBuilder builder;
    int port = 0;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
    builder.RegisterService(&service_);
    server_ = builder.BuildAndStart();
    ASSERT_NE(server_, nullptr);
    address_ = "127.0.0.1:" + std::to_string(port);
    client_ = Client::connect(address_, ClientOptions{.timeout = std::chrono::milliseconds(5000)});
  }
  void TearDown() override { server_->Shutdown(std::chrono::system_clock::now()); }

  // A batch of `batch` sequences' q, distinct per `salt`.
  static std::vector<float> make_q(int batch, float salt) {
    std::vector<float> q(static_cast<size_t>(batch) * 4 * 8);
    for (size_t i = 0; i < q.size(); ++i) q[i] = salt + 0.25f * static_cast<float>(i % 13);
    return q;
  }

  ScriptedService service_;
  std::unique_ptr<grpc::Server> server_;
  std::string address_;
  std::unique_ptr<Client> client_;
};

TEST_F(SessionTest, ConfigIsReadAndCached) {
  auto c = client_->config();
  ASSERT_TRUE(c.ok()) << c.error().to_string();
  EXPECT_EQ(c->num_q_heads, 4);
  EXPECT_EQ(c->head_dim, 8);
  EXPECT_EQ(c->cache_dtype, DType::kFloat16);
  EXPECT_EQ(c->q_row(), 32);
  EXPECT_EQ(c->kv_row(), 16);
}

TEST_F(SessionTest, UnaryDecodeConvertsTheOutputBack) {
  const auto q = make_q(2, 0.1f);
  const std::vector<uint64_t> ids = {3, 4};
  auto r = client_->decode({.sequence_ids = ids, .q = q, .q_dtype = DType::kFloat16});
  ASSERT_TRUE(r.ok()) << r.error().to_string();
  EXPECT_EQ(r->output, round_to_dtype(q, DType::kFloat16));
  EXPECT_EQ(r->lengths, (std::vector<int32_t>{10, 11}));
}

TEST_F(SessionTest, ServerErrorKeepsCodeMessageAndMethod) {
  const auto q = make_q(1, 0.f);
  const std::vector<uint64_t> ids = {5};
  auto r = client_->decode({.layer = kFailLayer, .sequence_ids = ids, .q = q});
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().code(), ErrorCode::kNotFound);
  EXPECT_EQ(r.error().method(), "Decode");
  EXPECT_EQ(r.error().message(), "sequence_ids[0]: unknown sequence 5");
}

TEST_F(SessionTest, DeadlineIsHonoured) {
  auto hurried = Client::connect(address_, ClientOptions{.timeout = std::chrono::milliseconds(50)});
  ASSERT_TRUE(hurried->config().ok());
  const auto q = make_q(1, 0.f);
  const std::vector<uint64_t> ids = {1};
  const auto t0 = std::chrono::steady_clock::now();
  auto r = hurried->decode({.layer = kSlowLayer, .sequence_ids = ids, .q = q});
  const auto waited = std::chrono::steady_clock::now() - t0;
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().code(), ErrorCode::kDeadlineExceeded);
  EXPECT_LT(waited, std::chrono::milliseconds(400));
}

TEST_F(SessionTest, StreamMatchesPipelinedResponsesInOrder) {
  auto stream = client_->open_stream();
  ASSERT_TRUE(stream.ok()) << stream.error().to_string();
  std::vector<std::vector<float>> qs;
  const std::vector<uint64_t> ids = {1};
  for (int i = 0; i < 5; ++i) qs.push_back(make_q(1, static_cast<float>(i)));
  for (int i = 0; i < 5; ++i) {
    auto id = (*stream)->send({.sequence_ids = ids, .q = qs[i]});
    ASSERT_TRUE(id.ok()) << id.error().to_string();
    EXPECT_EQ(*id, static_cast<uint64_t>(i + 1));  // numbered by the session
  }
  EXPECT_EQ((*stream)->outstanding(), 5u);
  for (int i = 0; i < 5; ++i) {
    auto r = (*stream)->receive();
    ASSERT_TRUE(r.ok()) << r.error().to_string();
    EXPECT_EQ(r->request_id, static_cast<uint64_t>(i + 1));
    EXPECT_EQ(r->output, qs[i]);
  }
  EXPECT_TRUE((*stream)->finish().ok());
}

TEST_F(SessionTest, StreamCarriesOnAfterAFailedRequest) {
  auto stream = client_->open_stream();
  ASSERT_TRUE(stream.ok());
  const auto q = make_q(1, 2.f);
  const std::vector<uint64_t> ids = {1};
  ASSERT_TRUE((*stream)->send({.sequence_ids = ids, .q = q}).ok());
  ASSERT_TRUE((*stream)->send({.layer = kFailLayer, .sequence_ids = ids, .q = q}).ok());
  ASSERT_TRUE((*stream)->send({.sequence_ids = ids, .q = q}).ok());
  EXPECT_TRUE((*stream)->receive().ok());
  auto failed = (*stream)->receive();
  ASSERT_FALSE(failed.ok());
  EXPECT_EQ(failed.error().code(), ErrorCode::kNotFound);
  EXPECT_EQ(failed.error().message(), "sequence_ids[0]: unknown sequence 5");
  auto after = (*stream)->call({.sequence_ids = ids, .q = q});  // the third, then a fourth
  ASSERT_TRUE(after.ok());
  EXPECT_EQ(after->request_id, 3u);
  EXPECT_TRUE((*stream)->receive().ok());
}

TEST_F(SessionTest, StreamRejectsAResponseForAnotherRequest) {
  auto stream = client_->open_stream();
  ASSERT_TRUE(stream.ok());
  const auto q = make_q(1, 0.f);
  const std::vector<uint64_t> ids = {1};
  auto r = (*stream)->call({.layer = kWrongIdLayer, .sequence_ids = ids, .q = q, .request_id = 77});
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().code(), ErrorCode::kInternal);
  EXPECT_NE(r.error().message().find("request_id: expected 77"), std::string::npos) << r.error().message();
  EXPECT_NE(r.error().message().find("received 1077"), std::string::npos) << r.error().message();
}

TEST_F(SessionTest, StreamChecksArgumentsBeforeSending) {
  auto stream = client_->open_stream();
  ASSERT_TRUE(stream.ok());
  const auto short_q = std::vector<float>(5);
  const std::vector<uint64_t> ids = {1};
  auto id = (*stream)->send({.sequence_ids = ids, .q = short_q});
  ASSERT_FALSE(id.ok());
  EXPECT_EQ(id.error().code(), ErrorCode::kInvalidArgument);
  EXPECT_EQ((*stream)->outstanding(), 0u);
  EXPECT_FALSE((*stream)->receive().ok());  // nothing outstanding
}

TEST_F(SessionTest, HealthFollowsTheServingStatus) {
  auto s = client_->health();
  ASSERT_TRUE(s.ok()) << s.error().to_string();
  EXPECT_EQ(*s, ServingStatus::kServing);
  server_->GetHealthCheckService()->SetServingStatus(false);
  s = client_->health();
  ASSERT_TRUE(s.ok()) << s.error().to_string();
  EXPECT_EQ(*s, ServingStatus::kNotServing);
  auto unknown = client_->health("no.such.Service");
  ASSERT_FALSE(unknown.ok());
  EXPECT_EQ(unknown.error().code(), ErrorCode::kNotFound);
}

TEST(SessionNoServer, UnreachableServerIsUnavailable) {
  // Port 1 on loopback: nothing listens there.
  auto c = Client::connect("127.0.0.1:1", ClientOptions{.timeout = std::chrono::milliseconds(2000)});
  auto s = c->health();
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.error().code(), ErrorCode::kUnavailable);
  EXPECT_EQ(s.error().method(), "Health/Check");
}

}  // namespace
}  // namespace pagoda::client
