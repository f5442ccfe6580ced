// DecodeStream: responses matched by request_id, in request order, pipelined
// (the client does not wait for answers), under concurrent streams; a bad
// request is answered with its error and the stream carries on.
#include <thread>

#include "e2e_fixture.h"

namespace pagoda::e2e {
namespace {

using StreamTest = ServerTest;

// Sends every request without waiting, then half-closes; returns the responses
// in arrival order and the stream's final status.
grpc::Status run_stream(v1::DecodeAttention::Stub& stub, const std::vector<v1::DecodeRequest>& requests,
                        std::vector<v1::DecodeResponse>& responses) {
  grpc::ClientContext ctx;
  auto stream = stub.DecodeStream(&ctx);
  std::thread writer([&] {
    for (const auto& r : requests)
      if (!stream->Write(r)) break;
    stream->WritesDone();
  });
  v1::DecodeResponse resp;
  while (stream->Read(&resp)) responses.push_back(resp);
  writer.join();
  return stream->Finish();
}

TEST_F(StreamTest, ResponsesComeInRequestOrderWithTheirIdsAndEqualUnaryBits) {
  std::vector<uint64_t> ids{make_sequence(9), make_sequence(33), make_sequence(2)};
  std::vector<v1::DecodeRequest> requests;
  for (int i = 0; i < 40; ++i) {
    const int32_t layer = i % 2;
    const std::vector<uint64_t> batch = i % 3 == 0 ? ids : std::vector<uint64_t>{ids[static_cast<size_t>(i) % 3]};
    v1::DecodeRequest r = session_.decode_request(layer, batch, random_q(batch.size()));
    r.set_request_id(1000 + static_cast<uint64_t>(i) * 7);
    if (i == 17) r.set_layer(9);  // fails alone
    requests.push_back(r);
  }
  std::vector<v1::DecodeResponse> responses;
  const grpc::Status status = run_stream(*stub_, requests, responses);
  ASSERT_TRUE(status.ok()) << status.error_message();
  ASSERT_EQ(responses.size(), requests.size());
  for (size_t i = 0; i < requests.size(); ++i) {
    ASSERT_EQ(responses[i].request_id(), requests[i].request_id()) << "position " << i;
    if (i == 17) {
      EXPECT_EQ(responses[i].error().code(), grpc::INVALID_ARGUMENT);
      EXPECT_NE(responses[i].error().message().find("layer"), std::string::npos);
      continue;
    }
    EXPECT_FALSE(responses[i].has_error()) << responses[i].error().message();
    grpc::ClientContext ctx;
    v1::DecodeResponse unary;
    ASSERT_TRUE(stub_->Decode(&ctx, requests[i], &unary).ok());
    EXPECT_EQ(responses[i].output().data(), unary.output().data()) << "position " << i;
    EXPECT_EQ(responses[i].lse().data(), unary.lse().data()) << "position " << i;
  }
}

TEST_F(StreamTest, MoreRequestsInFlightThanTheServerBuffersAllGetAnswered) {
  // Far more than the per-stream limit of requests in flight: reads pause for
  // writes and resume, nothing is lost or reordered.
  const uint64_t id = make_sequence(40);
  std::vector<v1::DecodeRequest> requests;
  for (int i = 0; i < 300; ++i) {
    v1::DecodeRequest r = session_.decode_request(i % 2, {id}, random_q(1), {}, {}, /*return_lse=*/false);
    r.set_request_id(static_cast<uint64_t>(i) + 1);
    requests.push_back(r);
  }
  std::vector<v1::DecodeResponse> responses;
  ASSERT_TRUE(run_stream(*stub_, requests, responses).ok());
  ASSERT_EQ(responses.size(), requests.size());
  for (size_t i = 0; i < requests.size(); ++i) {
    ASSERT_EQ(responses[i].request_id(), requests[i].request_id());
    EXPECT_FALSE(responses[i].has_error());
  }
}

TEST_F(StreamTest, ClientCancellingMidStreamLeavesTheServerWell) {
  const uint64_t id = make_sequence(64);
  for (int round = 0; round < 5; ++round) {
    grpc::ClientContext ctx;
    auto stream = stub_->DecodeStream(&ctx);
    for (int i = 0; i < 30; ++i) {
      v1::DecodeRequest r = session_.decode_request(0, {id}, random_q(1));
      r.set_request_id(static_cast<uint64_t>(i));
      if (!stream->Write(r)) break;
    }
    ctx.TryCancel();
    EXPECT_EQ(stream->Finish().error_code(), grpc::CANCELLED);
  }
  decode_checked(0, {id});
  decode_checked(1, {id});
}

TEST_F(StreamTest, PipelinedStepsOfOneSequenceEachSeeTheirOwnLength) {
  const uint64_t id = make_sequence(6);
  std::vector<v1::DecodeRequest> requests;
  std::vector<std::vector<float>> qs;
  for (int step = 0; step < 12; ++step) {
    const auto k = random_kv(1), v = random_kv(1);
    qs.push_back(random_q(1));
    v1::DecodeRequest r = session_.decode_request(0, {id}, qs.back(), k, v);
    r.set_request_id(static_cast<uint64_t>(step));
    requests.push_back(r);
  }
  std::vector<v1::DecodeResponse> responses;
  ASSERT_TRUE(run_stream(*stub_, requests, responses).ok());
  ASSERT_EQ(responses.size(), requests.size());
  for (size_t step = 0; step < requests.size(); ++step) {
    const auto k = tensor_values(requests[step].k()), v = tensor_values(requests[step].v());
    mirror_->append(id, 0, k, v);
    EXPECT_EQ(responses[step].lengths(0), 7 + static_cast<int32_t>(step));
    const testing::ReferenceResult want = mirror_->reference(0, {id}, qs[step], default_scale(g_));
    expect_close(want.out, tensor_values(responses[step].output()), kOutTolerance, "step " + std::to_string(step));
  }
}

TEST_F(StreamTest, ConcurrentStreamsStayMatchedAndExact) {
  constexpr int kStreams = 4;
  constexpr int kMessages = 25;
  std::vector<uint64_t> ids;
  std::vector<std::vector<v1::DecodeRequest>> requests(kStreams);
  std::vector<std::vector<std::vector<float>>> qs(kStreams);
  for (int s = 0; s < kStreams; ++s) {
    ids.push_back(make_sequence(5 + 13 * s));
    for (int m = 0; m < kMessages; ++m) {
      qs[s].push_back(random_q(1));
      v1::DecodeRequest r = session_.decode_request(m % 2, {ids.back()}, qs[s].back());
      r.set_request_id(static_cast<uint64_t>(s) << 32 | static_cast<uint64_t>(m));
      requests[s].push_back(r);
    }
  }
  std::vector<std::vector<v1::DecodeResponse>> responses(kStreams);
  std::vector<grpc::Status> statuses(kStreams);
  std::vector<std::unique_ptr<v1::DecodeAttention::Stub>> stubs;
  for (int s = 0; s < kStreams; ++s) stubs.push_back(make_stub(*server_));
  std::vector<std::thread> threads;
  for (int s = 0; s < kStreams; ++s) {
    threads.emplace_back([&, s] { statuses[s] = run_stream(*stubs[s], requests[s], responses[s]); });
  }
  for (auto& t : threads) t.join();
  for (int s = 0; s < kStreams; ++s) {
    ASSERT_TRUE(statuses[s].ok()) << statuses[s].error_message();
    ASSERT_EQ(responses[s].size(), static_cast<size_t>(kMessages));
    for (int m = 0; m < kMessages; ++m) {
      ASSERT_EQ(responses[s][m].request_id(), requests[s][m].request_id());
      const testing::ReferenceResult want = mirror_->reference(m % 2, {ids[s]}, qs[s][m], default_scale(g_));
      expect_close(want.out, tensor_values(responses[s][m].output()), kOutTolerance, "stream output");
    }
  }
}

}  // namespace
}  // namespace pagoda::e2e
