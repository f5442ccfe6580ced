// Dynamic batching: concurrent Decode calls are coalesced into one launch, and
// in deterministic mode that changes not one bit of any sequence's output.
#include <atomic>
#include <chrono>
#include <thread>

#include "e2e_fixture.h"
#include "engine/engine.h"

namespace pagoda::e2e {
namespace {

constexpr int kClients = 16;

class BatchingTest : public ServerTest {
 protected:
  ServerConfig config() const override {
    ServerConfig c = small_config();
    c.max_batch_wait_us = 200;
    c.num_blocks = 2048;  // 16 sequences of up to 346 tokens, and their forks
    return c;
  }

  void SetUp() override {
    ServerTest::SetUp();
    for (int i = 0; i < kClients; ++i) {
      ids_.push_back(make_sequence(1 + 23 * i));  // 1 to 346 tokens: 1 to 22 splits
      qs_.push_back(random_q(1));
      stubs_.push_back(make_stub(*server_));
      // Connected before any test pauses the engine: a channel's first call
      // must not be the one whose connection is still being set up.
      grpc::ClientContext ctx;
      ctx.set_wait_for_ready(true);
      v1::GetConfigResponse config;
      ASSERT_TRUE(stubs_.back()->GetConfig(&ctx, v1::GetConfigRequest(), &config).ok());
    }
  }

  // Runs fn(client) on kClients threads at once.
  template <typename Fn>
  void concurrently(Fn fn) {
    std::vector<std::thread> threads;
    for (int c = 0; c < kClients; ++c) threads.emplace_back([&, c] { fn(c); });
    for (auto& t : threads) t.join();
  }

  void wait_until_queued(size_t n) {
    const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while (server_->engine().queued() < n && std::chrono::steady_clock::now() < give_up) {
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    ASSERT_EQ(server_->engine().queued(), n);
  }

  std::vector<uint64_t> ids_;
  std::vector<std::vector<float>> qs_;
  std::vector<std::unique_ptr<v1::DecodeAttention::Stub>> stubs_;
};

TEST_F(BatchingTest, SixteenConcurrentClientsGetTheBitsOfDecodingAlone) {
  std::vector<std::string> alone(kClients);
  for (int c = 0; c < kClients; ++c) {
    v1::DecodeResponse r;
    ASSERT_TRUE(session_.decode(0, {ids_[c]}, qs_[c], r).ok());
    alone[c] = r.output().data() + r.lse().data();
  }
  // All 16 calls wait in the queue, then go as ONE launch.
  const Engine::Counters before = server_->engine().counters();
  server_->engine().pause();
  std::vector<std::string> batched(kClients);
  std::thread release([&] {
    wait_until_queued(kClients);
    server_->engine().resume();
  });
  concurrently([&](int c) {
    Session s{stubs_[c].get(), g_};
    v1::DecodeResponse r;
    EXPECT_TRUE(s.decode(0, {ids_[c]}, qs_[c], r).ok());
    batched[c] = r.output().data() + r.lse().data();
  });
  release.join();
  const Engine::Counters after = server_->engine().counters();
  EXPECT_EQ(after.launches - before.launches, 1u);
  EXPECT_EQ(after.largest_batch, kClients);
  for (int c = 0; c < kClients; ++c) EXPECT_EQ(batched[c], alone[c]) << "client " << c;

  // Free running: whatever batches form, the bits stay.
  std::atomic<int> mismatches{0};
  concurrently([&](int c) {
    Session s{stubs_[c].get(), g_};
    for (int rep = 0; rep < 10; ++rep) {
      v1::DecodeResponse r;
      EXPECT_TRUE(s.decode(0, {ids_[c]}, qs_[c], r).ok());
      if (r.output().data() + r.lse().data() != alone[c]) ++mismatches;
    }
  });
  EXPECT_EQ(mismatches.load(), 0);
}

TEST_F(BatchingTest, CoalescedAppendsMatchTheSameStepTakenAlone) {
  // Twins (forks) take the same step alone afterwards; the bits must agree.
  std::vector<uint64_t> twins;
  for (uint64_t id : ids_) {
    grpc::ClientContext ctx;
    v1::ForkSequenceRequest req;
    req.set_source_id(id);
    v1::ForkSequenceResponse resp;
    ASSERT_TRUE(stub_->ForkSequence(&ctx, req, &resp).ok());
    twins.push_back(resp.sequence_id());
    mirror_->fork(id, resp.sequence_id());
  }
  std::vector<std::vector<float>> ks, vs;
  for (int c = 0; c < kClients; ++c) {
    ks.push_back(random_kv(1));
    vs.push_back(random_kv(1));
  }
  const uint64_t launches_before = server_->engine().counters().launches;
  server_->engine().pause();
  std::vector<v1::DecodeResponse> batched(kClients);
  std::thread release([&] {
    wait_until_queued(kClients);
    server_->engine().resume();
  });
  concurrently([&](int c) {
    Session s{stubs_[c].get(), g_};
    const grpc::Status st = s.decode(1, {ids_[c]}, qs_[c], batched[c], ks[c], vs[c]);
    EXPECT_TRUE(st.ok()) << "client " << c << ": " << st.error_code() << " " << st.error_message();
  });
  release.join();
  EXPECT_EQ(server_->engine().counters().launches - launches_before, 1u);
  for (int c = 0; c < kClients; ++c) {
    ASSERT_EQ(batched[c].lengths_size(), 1) << "client " << c << " got no answer";
    v1::DecodeResponse alone;
    ASSERT_TRUE(session_.decode(1, {twins[c]}, qs_[c], alone, ks[c], vs[c]).ok());
    EXPECT_EQ(batched[c].lengths(0), alone.lengths(0));
    EXPECT_EQ(batched[c].output().data(), alone.output().data()) << "client " << c;
    mirror_->append(twins[c], 1, ks[c], vs[c]);
    const testing::ReferenceResult want = mirror_->reference(1, {twins[c]}, qs_[c], default_scale(g_));
    expect_close(want.out, tensor_values(alone.output()), kOutTolerance, "twin output");
  }
}

}  // namespace
}  // namespace pagoda::e2e
