// The C++ ShardedClient over three in-process servers: a batch split over the
// pods has the bits of the same batch on one server, the ring places keys as
// the Python client does, adding a pod moves few keys and only to it, and a
// pod that is down is UNAVAILABLE naming its endpoint.
#include <gtest/gtest.h>

#include <chrono>
#include <set>

#include <fmt/format.h>

#include "e2e_fixture.h"
#include "pagoda/client/sharded_client.h"

namespace pagoda::e2e {
namespace {

using client::HashRing;

TEST(HashRing, PlacesKeysAsThePythonClientDoes) {
  // Values printed by client/python/pagoda/sharded.py for the same inputs.
  EXPECT_EQ(HashRing::hash("a:1#0"), 0xdd7a34b63194174dull);
  EXPECT_EQ(HashRing::hash(""), 0xf52a15e9a9b5e89bull);
  EXPECT_EQ(HashRing({"a:1", "b:1", "c:1"}).owners("seq-1", 3), (std::vector<std::string>{"b:1", "a:1", "c:1"}));
}

TEST(HashRing, AddingAPodMovesFewKeysAndOnlyToIt) {
  const HashRing three({"a:1", "b:1", "c:1"}), four({"a:1", "b:1", "c:1", "d:1"});
  int moved = 0;
  for (int i = 0; i < 2000; ++i) {
    const std::string key = fmt::format("k{}", i);
    const std::string before = three.owners(key).front(), after = four.owners(key).front();
    if (before == after) continue;
    ++moved;
    EXPECT_EQ(after, "d:1") << key << " moved between old pods";
  }
  EXPECT_LT(moved, 800) << "more than 40% of the keys moved";
}

TEST(ShardedClient, ABatchSplitOverPodsHasTheBitsOfOneServer) {
  std::vector<std::unique_ptr<PagodaServer>> pods;
  std::vector<std::string> endpoints;
  for (int i = 0; i < 3; ++i) {
    pods.push_back(start_server(small_config()));
    endpoints.push_back("127.0.0.1:" + std::to_string(pods.back()->port()));
  }
  auto reference_server = start_server(small_config());
  auto reference = client::Client::connect("127.0.0.1:" + std::to_string(reference_server->port()));
  auto sharded = client::ShardedClient::connect(endpoints);
  ASSERT_TRUE(sharded.ok());
  auto& sc = **sharded;
  const CacheGeometry& g = pods.front()->config().geometry;
  std::mt19937 rng(5);
  const size_t kv_row = static_cast<size_t>(g.num_kv_heads * g.head_dim);
  const size_t q_row = static_cast<size_t>(g.num_q_heads * g.head_dim);
  std::vector<client::SequenceRef> refs;
  std::vector<uint64_t> alone;
  std::set<std::string> used;
  for (int i = 0; i < 6; ++i) {
    const size_t n = 10 + 9 * static_cast<size_t>(i);
    const auto k = random_values(rng, n * kv_row), v = random_values(rng, n * kv_row);
    auto ref = sc.create_sequence("", fmt::format("seq-{}", i));
    ASSERT_TRUE(ref.ok()) << ref.error().to_string();
    ASSERT_TRUE(sc.append_kv(*ref, 0, k, v).ok());
    refs.push_back(*ref);
    used.insert(ref->endpoint);
    auto id = reference->create_sequence();
    ASSERT_TRUE(id.ok());
    ASSERT_TRUE(reference->append_kv(*id, 0, k, v).ok());
    alone.push_back(*id);
  }
  EXPECT_GE(used.size(), 2u) << "every sequence landed on one pod";
  const auto q = random_values(rng, 6 * q_row), k = random_values(rng, 6 * kv_row), v = random_values(rng, 6 * kv_row);
  auto got = sc.decode({.layer = 0, .sequences = refs, .q = q, .k = k, .v = v, .return_lse = true});
  ASSERT_TRUE(got.ok()) << got.error().to_string();
  auto want = reference->decode({.layer = 0, .sequence_ids = alone, .q = q, .k = k, .v = v, .return_lse = true});
  ASSERT_TRUE(want.ok());
  EXPECT_EQ(got->lengths, want->lengths);
  EXPECT_EQ(got->output, want->output) << "the sharded batch differs from one server";
  EXPECT_EQ(got->lse, want->lse);
  for (auto& s : pods) s->shutdown(0);
  reference_server->shutdown(0);
}

TEST(ShardedClient, APodThatIsDownIsUnavailableNamingIt) {
  auto live = start_server(small_config());
  // A port nothing listens on: bound, then released.
  auto gone = start_server(small_config());
  const std::string dead = "127.0.0.1:" + std::to_string(gone->port());
  gone->shutdown(0);
  gone.reset();
  client::ClientOptions options;
  options.timeout = std::chrono::seconds(3);
  auto sharded = client::ShardedClient::connect({dead, "127.0.0.1:" + std::to_string(live->port())}, options);
  ASSERT_TRUE(sharded.ok());
  std::string key;
  for (int i = 0; key.empty(); ++i) {
    const std::string candidate = fmt::format("x{}", i);
    if ((*sharded)->ring().owners(candidate).front() == dead) key = candidate;
  }
  const auto t0 = std::chrono::steady_clock::now();
  auto ref = (*sharded)->create_sequence("", key);
  ASSERT_FALSE(ref.ok());
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(5));
  EXPECT_EQ(ref.error().code(), client::ErrorCode::kUnavailable);
  EXPECT_EQ(ref.error().message().rfind(dead + ": ", 0), 0u) << ref.error().message();
  live->shutdown(0);
}

}  // namespace
}  // namespace pagoda::e2e
