// Client::migrate between two in-process servers: bits kept, source freed, a
// client appending all along loses no token, a refused stage keeps the source.
#include <gtest/gtest.h>

#include <atomic>
#include <mutex>
#include <thread>

#include "e2e_fixture.h"
#include "pagoda/client/client.h"

namespace pagoda::e2e {
namespace {

class MigrateTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ServerConfig b = small_config();
    b.block_size = 8;
    b.num_blocks = 256;
    a_ = start_server(small_config());
    b_ = start_server(b);
    ca_ = client::Client::connect("127.0.0.1:" + std::to_string(a_->port()));
    cb_ = client::Client::connect("127.0.0.1:" + std::to_string(b_->port()));
  }
  void TearDown() override {
    a_->shutdown(0);
    b_->shutdown(0);
  }
  const CacheGeometry& g() const { return a_->config().geometry; }
  std::vector<float> kv(int32_t n) { return random_values(rng_, static_cast<size_t>(n) * g().num_kv_heads * g().head_dim); }
  uint64_t make(client::Client& c, int32_t n) {
    auto id = c.create_sequence("moving");
    EXPECT_TRUE(id.ok());
    for (int32_t l = 0; l < g().num_layers; ++l) EXPECT_TRUE(c.append_kv(*id, l, kv(n), kv(n)).ok());
    return *id;
  }
  std::vector<float> out(client::Client& c, uint64_t id, const std::vector<float>& q, int32_t layer) {
    client::DecodeArgs args;
    args.layer = layer;
    args.sequence_ids = {id};
    args.q = q;
    args.return_lse = true;
    auto r = c.decode(args);
    EXPECT_TRUE(r.ok()) << (r.ok() ? "" : r.error().to_string());
    std::vector<float> bits = r->output;
    bits.insert(bits.end(), r->lse.begin(), r->lse.end());
    return bits;
  }

  std::unique_ptr<PagodaServer> a_, b_;
  std::unique_ptr<client::Client> ca_, cb_;
  std::mt19937 rng_{11};
};

TEST_F(MigrateTest, MovesBitsAndFreesTheSource) {
  const uint64_t id = make(*ca_, 50);
  const std::vector<float> q = random_values(rng_, static_cast<size_t>(g().num_q_heads * g().head_dim));
  const std::vector<float> want0 = out(*ca_, id, q, 0), want1 = out(*ca_, id, q, 1);
  auto moved = ca_->migrate(id, *cb_);
  ASSERT_TRUE(moved.ok()) << moved.error().to_string();
  EXPECT_EQ(moved->layer_lengths, (std::vector<int32_t>{50, 50}));
  EXPECT_EQ(out(*cb_, moved->sequence_id, q, 0), want0);
  EXPECT_EQ(out(*cb_, moved->sequence_id, q, 1), want1);
  EXPECT_EQ(ca_->get_sequence(id).error().code(), client::ErrorCode::kNotFound);
  auto info = cb_->get_sequence(moved->sequence_id);
  ASSERT_TRUE(info.ok());
  EXPECT_EQ(info->label, "moving");
}

TEST_F(MigrateTest, AnAppendingClientLosesNoToken) {
  const uint64_t id = make(*ca_, 200);
  std::mutex steps;  // held while the appender appends one step; hold() takes it for good
  std::atomic<bool> held{false};
  std::atomic<int32_t> appended{0};
  std::thread appender([&] {
    std::mt19937 rng(3);
    while (!held.load()) {
      {
        std::lock_guard lock(steps);
        if (held.load()) break;
        for (int32_t l = 0; l < g().num_layers; ++l) {
          const auto row = random_values(rng, static_cast<size_t>(g().num_kv_heads * g().head_dim));
          ASSERT_TRUE(ca_->append_kv(id, l, row, row).ok());
        }
        ++appended;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
  });
  while (appended.load() < 3) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  std::unique_lock<std::mutex> holding(steps, std::defer_lock);
  client::MigrateOptions options;
  options.last_stage_tokens = 0;
  options.hold = [&] {
    holding.lock();
    held.store(true);
  };
  auto moved = ca_->migrate(id, *cb_, options);
  if (holding.owns_lock()) holding.unlock();
  held.store(true);
  appender.join();
  ASSERT_TRUE(moved.ok()) << moved.error().to_string();
  EXPECT_GE(moved->stages, 2);
  const int32_t total = 200 + appended.load();
  EXPECT_EQ(moved->layer_lengths, (std::vector<int32_t>{total, total}));
}

TEST_F(MigrateTest, ARefusedImportKeepsTheSource) {
  ServerConfig other = small_config();
  other.kv_heads = 4;
  auto c = start_server(other);
  auto cc = client::Client::connect("127.0.0.1:" + std::to_string(c->port()));
  const uint64_t id = make(*ca_, 10);
  auto moved = ca_->migrate(id, *cc);
  ASSERT_FALSE(moved.ok());
  EXPECT_EQ(moved.error().code(), client::ErrorCode::kFailedPrecondition) << moved.error().to_string();
  EXPECT_TRUE(ca_->get_sequence(id).ok());
  c->shutdown(0);
}

}  // namespace
}  // namespace pagoda::e2e
