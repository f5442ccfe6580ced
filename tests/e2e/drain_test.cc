// SIGTERM's drain (docs/design.md §5, §11) under load from clients that keep their
// channels open, as every orchestrator does: it returns within a second of the
// last in-flight call and cancels none. (Idle connections holding the drain
// show only across processes: lifecycle_test.cc, ServerBinary.)
#include <atomic>
#include <chrono>
#include <map>
#include <mutex>
#include <thread>

#include "cache/cache_manager.h"
#include "e2e_fixture.h"

namespace pagoda::e2e {
namespace {

using Clock = std::chrono::steady_clock;

class DrainTest : public ServerTest {
 protected:
  ServerConfig config() const override {
    ServerConfig c = small_config();
    c.drain_timeout = 30;
    return c;
  }
};

// Eight clients append-and-decode in a loop on channels they keep; the drain
// returns within a second of the last in-flight call, every call OK or
// UNAVAILABLE, and each sequence grew by exactly its OK calls.
TEST_F(DrainTest, UnderLoadTheDrainEndsSoonAfterTheLastCallAndCancelsNone) {
  constexpr int kClients = 8;
  std::vector<uint64_t> ids;
  for (int c = 0; c < kClients; ++c) ids.push_back(make_sequence(4));
  std::vector<std::unique_ptr<v1::DecodeAttention::Stub>> stubs;
  for (int c = 0; c < kClients; ++c) stubs.push_back(make_stub(*server_));
  std::mutex mu;
  std::map<int, int> codes;
  std::vector<int> ok_appends(kClients, 0);
  Clock::time_point last_answer{};
  std::vector<std::thread> clients;
  for (int c = 0; c < kClients; ++c) {
    clients.emplace_back([&, c] {
      Session session{stubs[static_cast<size_t>(c)].get(), g_};
      std::mt19937 rng(static_cast<unsigned>(c));
      for (int call = 0;; ++call) {
        const auto kv = call < 60 ? random_values(rng, static_cast<size_t>(g_.num_kv_heads) * g_.head_dim)
                                  : std::vector<float>{};
        v1::DecodeResponse r;
        const grpc::Status s = session.decode(
            0, {ids[static_cast<size_t>(c)]}, random_values(rng, static_cast<size_t>(g_.num_q_heads) * g_.head_dim),
            r, kv, kv);
        std::lock_guard lock(mu);
        ++codes[s.error_code()];
        last_answer = std::max(last_answer, Clock::now());
        if (s.ok() && !kv.empty()) ++ok_appends[static_cast<size_t>(c)];
        if (!s.ok()) return;
      }
    });
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  server_->shutdown(30);
  const auto returned = Clock::now();
  for (auto& t : clients) t.join();
  for (const auto& [code, n] : codes) {
    EXPECT_TRUE(code == grpc::OK || code == grpc::UNAVAILABLE) << n << " calls ended with code " << code;
  }
  ASSERT_GT(codes[grpc::OK], 0);
  EXPECT_LT(std::chrono::duration<double>(returned - last_answer).count(), 1.0)
      << "the drain went on after the last in-flight call";
  for (int c = 0; c < kClients; ++c) {
    auto info = server_->cache().info(ids[static_cast<size_t>(c)]);
    ASSERT_TRUE(info.ok());
    EXPECT_EQ(info->layer_lengths[0], 4 + ok_appends[static_cast<size_t>(c)]) << "client " << c;
  }
}

}  // namespace
}  // namespace pagoda::e2e
