// Faults a hostile or unlucky client meets (docs/design.md §11): a stream message that
// does not parse ends the stream INVALID_ARGUMENT naming it, after every
// earlier request is answered; an oversized message on a stream is answered
// on its own and the stream carries on; a drain under load answers every call
// OK or UNAVAILABLE, never CANCELLED, and an UNAVAILABLE call changed nothing.
#include <atomic>
#include <chrono>
#include <map>
#include <mutex>
#include <thread>

#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/support/proto_buffer_writer.h>

#include "cache/cache_manager.h"
#include "e2e_fixture.h"
#include "metrics/scrape.h"
#include "observability/metrics.h"

namespace pagoda::e2e {
namespace {

grpc::ByteBuffer raw_bytes(const std::string& bytes) {
  grpc::Slice slice(bytes);
  return grpc::ByteBuffer(&slice, 1);
}

grpc::ByteBuffer serialized(const google::protobuf::Message& m) { return raw_bytes(m.SerializeAsString()); }

// A DecodeStream driven with raw messages through the generic stub, one
// operation at a time.
class RawStream {
 public:
  explicit RawStream(int port)
      : stub_(grpc::CreateChannel("127.0.0.1:" + std::to_string(port), grpc::InsecureChannelCredentials())) {
    ctx_.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(20));
    call_ = stub_.PrepareCall(&ctx_, "/pagoda.v1.DecodeAttention/DecodeStream", &cq_);
    call_->StartCall(tag());
    step();
  }
  bool write(const grpc::ByteBuffer& b) {
    call_->Write(b, tag());
    return step();
  }
  void writes_done() {
    call_->WritesDone(tag());
    step();
  }
  bool read(v1::DecodeResponse& r) {
    grpc::ByteBuffer b;
    call_->Read(&b, tag());
    if (!step()) return false;
    std::vector<grpc::Slice> slices;
    std::string bytes;
    if (b.Dump(&slices).ok())
      for (const auto& s : slices) bytes.append(reinterpret_cast<const char*>(s.begin()), s.size());
    return r.ParseFromString(bytes);
  }
  grpc::Status finish() {
    grpc::Status status;
    call_->Finish(&status, tag());
    step();
    return status;
  }

 private:
  void* tag() { return reinterpret_cast<void*>(++next_tag_); }
  bool step() {
    void* got = nullptr;
    bool ok = false;
    EXPECT_TRUE(cq_.Next(&got, &ok));
    EXPECT_EQ(got, reinterpret_cast<void*>(next_tag_));
    return ok;
  }

  grpc::GenericStub stub_;
  grpc::ClientContext ctx_;
  grpc::CompletionQueue cq_;
  std::unique_ptr<grpc::GenericClientAsyncReaderWriter> call_;
  intptr_t next_tag_ = 0;
};

class ReliabilityTest : public ServerTest {
 protected:
  ServerConfig config() const override {
    ServerConfig c = small_config();
    c.max_message_bytes = 64 << 10;
    return c;
  }
};

TEST_F(ReliabilityTest, AStreamMessageThatDoesNotParseEndsTheStreamNamingIt) {
  const uint64_t id = make_sequence(20);
  v1::DecodeRequest first = session_.decode_request(0, {id}, random_q(1));
  first.set_request_id(1);
  v1::DecodeRequest third = first;
  third.set_request_id(3);
  RawStream stream(server_->port());
  ASSERT_TRUE(stream.write(serialized(first)));
  ASSERT_TRUE(stream.write(raw_bytes("\xff\xff\xff")));
  (void)stream.write(serialized(third));  // may already be refused
  stream.writes_done();
  v1::DecodeResponse r;
  ASSERT_TRUE(stream.read(r));
  EXPECT_EQ(r.request_id(), 1u);
  EXPECT_FALSE(r.has_error());
  EXPECT_FALSE(stream.read(r)) << "request 3 was read past the unparsable message";
  const grpc::Status s = stream.finish();
  EXPECT_EQ(s.error_code(), grpc::INVALID_ARGUMENT);
  EXPECT_EQ(s.error_message(),
            "DecodeStream message 2: cannot parse its 3 bytes as pagoda.v1.DecodeRequest; every earlier request was "
            "answered");
}

TEST_F(ReliabilityTest, AnOversizedStreamMessageIsAnsweredAloneAndTheStreamCarriesOn) {
  const uint64_t id = make_sequence(60);
  // 40 rows of q, k and v: about 120 KiB, past the 64 KiB limit.
  v1::DecodeRequest big = session_.decode_request(0, {id}, random_q(40), random_kv(40), random_kv(40));
  big.add_q_lengths(40);
  big.set_request_id(1);
  ASSERT_GT(big.ByteSizeLong(), 64u << 10);
  v1::DecodeRequest small = session_.decode_request(0, {id}, random_q(1));
  small.set_request_id(2);
  RawStream stream(server_->port());
  ASSERT_TRUE(stream.write(serialized(big)));
  ASSERT_TRUE(stream.write(serialized(small)));
  stream.writes_done();
  v1::DecodeResponse r;
  ASSERT_TRUE(stream.read(r));
  EXPECT_EQ(r.request_id(), 1u);
  EXPECT_EQ(r.error().code(), grpc::RESOURCE_EXHAUSTED);
  EXPECT_EQ(r.error().message(), fmt::format("request: expected at most 65536 bytes (--max-message-bytes), "
                                             "received {}",
                                             big.ByteSizeLong()));
  ASSERT_TRUE(stream.read(r));
  EXPECT_EQ(r.request_id(), 2u);
  EXPECT_FALSE(r.has_error());
  EXPECT_TRUE(stream.finish().ok());
  v1::GetSequenceResponse info;
  ASSERT_TRUE(session_.get(id, info).ok());
  EXPECT_EQ(info.layer_lengths(0), 60) << "the refused request appended";
  // The same request unary: refused the same way.
  v1::DecodeResponse resp;
  grpc::ClientContext ctx;
  const grpc::Status unary = stub_->Decode(&ctx, big, &resp);
  EXPECT_EQ(unary.error_code(), grpc::RESOURCE_EXHAUSTED);
}

// Past twice the limit too (gRPC's own receive limit once was 2x and ended
// the stream): answered alone, and the stream carries on.
TEST_F(ReliabilityTest, AStreamMessagePastTwiceTheLimitIsAnsweredAloneToo) {
  const uint64_t id = make_sequence(60);
  v1::DecodeRequest huge = session_.decode_request(0, {id}, random_q(100), random_kv(100), random_kv(100));
  huge.add_q_lengths(100);
  huge.set_request_id(1);
  ASSERT_GT(huge.ByteSizeLong(), 4u * (64u << 10));
  v1::DecodeRequest small = session_.decode_request(0, {id}, random_q(1));
  small.set_request_id(2);
  RawStream stream(server_->port());
  ASSERT_TRUE(stream.write(serialized(huge)));
  ASSERT_TRUE(stream.write(serialized(small)));
  stream.writes_done();
  v1::DecodeResponse r;
  ASSERT_TRUE(stream.read(r)) << "the stream ended at the oversized message";
  EXPECT_EQ(r.request_id(), 1u);
  EXPECT_EQ(r.error().code(), grpc::RESOURCE_EXHAUSTED);
  EXPECT_EQ(r.error().message(), fmt::format("request: expected at most 65536 bytes (--max-message-bytes), "
                                             "received {}",
                                             huge.ByteSizeLong()));
  ASSERT_TRUE(stream.read(r));
  EXPECT_EQ(r.request_id(), 2u);
  EXPECT_FALSE(r.has_error());
  EXPECT_TRUE(stream.finish().ok());
  v1::GetSequenceResponse info;
  ASSERT_TRUE(session_.get(id, info).ok());
  EXPECT_EQ(info.layer_lengths(0), 60) << "the refused request appended";
}

// Sixteen clients call in a loop (append-and-decode, or GetSequence); the server drains under them.
// Every call ends OK or UNAVAILABLE, and each sequence grew by exactly its OK calls.
TEST_F(ReliabilityTest, ADrainUnderLoadAnswersOkOrUnavailableNeverCancelled) {
  constexpr int kClients = 16;
  std::vector<uint64_t> ids;
  for (int c = 0; c < kClients; ++c) ids.push_back(make_sequence(16));
  std::atomic<bool> stop{false};
  std::mutex mu;
  std::map<int, int> codes;  // gRPC code -> calls
  std::vector<int> ok_appends(kClients, 0);
  std::vector<std::thread> clients;
  for (int c = 0; c < kClients; ++c) {
    clients.emplace_back([&, c] {
      auto stub = make_stub(*server_);
      Session session{stub.get(), g_};
      std::mt19937 rng(static_cast<unsigned>(c));
      for (int call = 0; !stop.load(); ++call) {
        v1::DecodeResponse r;
        // Odd clients: appends while the cache has room for every client's, then
        // decodes only. Even ones: GetSequence as fast as it answers.
        const auto kv = call < 100 ? random_values(rng, static_cast<size_t>(g_.num_kv_heads) * g_.head_dim)
                                   : std::vector<float>{};
        v1::GetSequenceResponse info;
        const grpc::Status s =
            c % 2 == 0 ? session.get(ids[static_cast<size_t>(c)], info)
                       : session.decode(0, {ids[static_cast<size_t>(c)]},
                                        random_values(rng, static_cast<size_t>(g_.num_q_heads) * g_.head_dim), r, kv, kv);
        std::lock_guard lock(mu);
        ++codes[s.error_code()];
        if (s.ok() && c % 2 == 1 && !kv.empty()) ++ok_appends[static_cast<size_t>(c)];
        if (s.error_code() == grpc::UNAVAILABLE) return;
      }
    });
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  server_->shutdown(10.0);
  stop = true;
  for (auto& t : clients) t.join();
  for (const auto& [code, n] : codes) {
    EXPECT_TRUE(code == grpc::OK || code == grpc::UNAVAILABLE) << n << " calls ended with code " << code;
  }
  EXPECT_GT(codes[grpc::OK], 0);
  for (int c = 0; c < kClients; ++c) {
    auto info = server_->cache().info(ids[static_cast<size_t>(c)]);
    ASSERT_TRUE(info.ok());
    EXPECT_EQ(info->layer_lengths[0], 16 + ok_appends[static_cast<size_t>(c)]) << "client " << c;
  }
}

class LimitsTest : public ServerTest {
 protected:
  ServerConfig config() const override {
    ServerConfig c = small_config();  // blocks of 4 tokens
    c.max_label_bytes = 16;
    c.max_request_tokens = 8;
    c.max_request_blocks = 1;
    c.max_stream_in_flight = 3;
    c.idle_ttl = 0.3;
    return c;
  }
  grpc::Status append(uint64_t id, int32_t tokens) {
    return session_.append(id, 0, random_kv(static_cast<size_t>(tokens)), random_kv(static_cast<size_t>(tokens)));
  }
  double evicted() {
    std::vector<std::string> errors;
    return testing::parse_exposition(server_->metrics().exposition(), &errors)
        .value("pagoda_sequences_evicted_total")
        .value_or(-1);
  }
};

TEST_F(LimitsTest, GetConfigReportsTheLimits) {
  v1::GetConfigResponse c;
  ASSERT_TRUE(session_.config(c).ok());
  EXPECT_EQ(c.max_label_bytes(), 16);
  EXPECT_EQ(c.max_request_tokens(), 8);
  EXPECT_EQ(c.max_request_blocks(), 1);
  EXPECT_EQ(c.max_stream_in_flight(), 3);
  EXPECT_DOUBLE_EQ(c.idle_ttl_seconds(), 0.3);
}

TEST_F(LimitsTest, LabelsTokensAndBlocksPastTheirLimitsAreRefusedAndChangeNothing) {
  uint64_t id = 0;
  EXPECT_TRUE(session_.create(id, std::string(16, 'x')).ok());
  uint64_t refused = 0;
  const grpc::Status label = session_.create(refused, std::string(17, 'x'));
  EXPECT_EQ(label.error_code(), grpc::INVALID_ARGUMENT);
  EXPECT_EQ(label.error_message(), "label: expected at most 16 bytes (--max-label-bytes), received 17");
  EXPECT_EQ(server_->cache().num_sequences(), 1u);

  const grpc::Status tokens = append(id, 9);
  EXPECT_EQ(tokens.error_code(), grpc::INVALID_ARGUMENT);
  EXPECT_EQ(tokens.error_message(), "k: expected at most 8 tokens per request (--max-request-tokens), received 9");
  const grpc::Status blocks = append(id, 8);  // two blocks of 4
  EXPECT_EQ(blocks.error_code(), grpc::RESOURCE_EXHAUSTED);
  EXPECT_EQ(blocks.error_message(),
            "request: expected at most 1 new blocks per request (--max-request-blocks), needs 2");
  ASSERT_TRUE(append(id, 4).ok());
  // A Decode appending one token per query row: 9 rows are 9 tokens.
  v1::DecodeRequest r = session_.decode_request(0, {id}, random_q(9), random_kv(9), random_kv(9));
  r.add_q_lengths(9);
  v1::DecodeResponse resp;
  grpc::ClientContext ctx;
  const grpc::Status decode = stub_->Decode(&ctx, r, &resp);
  EXPECT_EQ(decode.error_code(), grpc::INVALID_ARGUMENT);
  EXPECT_EQ(decode.error_message(), "k: expected at most 8 tokens per request (--max-request-tokens), received 9");
  v1::GetSequenceResponse info;
  ASSERT_TRUE(session_.get(id, info).ok());
  EXPECT_EQ(info.layer_lengths(0), 4);
}

TEST_F(LimitsTest, IdleSequencesAreFreedAndCountedUsedOnesStay) {
  uint64_t idle = 0, used = 0;
  ASSERT_TRUE(session_.create(idle, "idle").ok());
  ASSERT_TRUE(session_.create(used, "used").ok());
  ASSERT_TRUE(append(idle, 4).ok());
  EXPECT_EQ(evicted(), 0);
  const auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(700);
  v1::GetSequenceResponse info;
  while (std::chrono::steady_clock::now() < until) {
    ASSERT_TRUE(session_.get(used, info).ok());  // a use every 50 ms
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  EXPECT_EQ(session_.get(idle, info).error_code(), grpc::NOT_FOUND);
  EXPECT_TRUE(session_.get(used, info).ok());
  EXPECT_EQ(evicted(), 1);
  v1::GetConfigResponse c;
  ASSERT_TRUE(session_.config(c).ok());
  EXPECT_EQ(c.free_blocks(), c.total_blocks()) << "the idle sequence's block was not returned";
}

}  // namespace
}  // namespace pagoda::e2e
