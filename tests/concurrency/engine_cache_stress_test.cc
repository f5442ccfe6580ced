// The engine and the cache manager under many threads, over the fake backend
// (no kernels, no gRPC: ThreadSanitizer, `make tsan`, sees every access):
// clients decode-with-append on their own sequences in every layer while
// others fork a shared prefix, append to the fork (copy-on-write of a partly
// filled block), truncate and free it. Every answer is checked exactly
// against what each client knows it appended, and at the end every block is
// accounted for.
#include <gtest/gtest.h>

#include <atomic>
#include <thread>
#include <vector>

#include "cache/cache_manager.h"
#include "concurrency/fake_backend.h"
#include "engine/engine.h"

namespace pagoda::testing {
namespace {

class Waiter final : public WorkDone {
 public:
  void work_done(const Status& s) override {
    std::lock_guard lock(mu_);
    status_ = s;
    done_ = true;
    cv_.notify_all();
  }
  Status wait() {
    std::unique_lock lock(mu_);
    cv_.wait(lock, [&] { return done_; });
    done_ = false;
    return status_;
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  bool done_ = false;
  Status status_;
};

CacheGeometry geometry() {
  CacheGeometry g;
  g.num_layers = 3;
  g.num_q_heads = 2;
  g.num_kv_heads = 1;
  g.head_dim = 64;
  g.block_size = 4;
  g.num_blocks = 4096;
  g.dtype = DType::kFloat32;
  return g;
}

// One Decode of `id` on `layer` appending a token whose marker is `marker`.
// Returns the sum the fake backend answered, or NaN on failure.
struct Caller {
  Engine& engine;
  const CacheGeometry& g;
  Waiter waiter;
  std::vector<float> q, kv, out, lse;
  int32_t length = 0, splits = 0;

  Caller(Engine& e, const CacheGeometry& geom)
      : engine(e), g(geom), q(static_cast<size_t>(geom.num_q_heads) * geom.head_dim, 1.f),
        kv(static_cast<size_t>(geom.num_kv_heads) * geom.head_dim, 0.f), out(q.size()),
        lse(static_cast<size_t>(geom.num_q_heads)) {}

  StatusOr<double> step(SequenceId id, int32_t layer, float marker, bool append) {
    DecodeWork w;
    w.layer = layer;
    w.ids = std::span<const SequenceId>(&id, 1);
    w.rows = 1;
    w.q = q.data();
    kv[0] = marker;
    if (append) {
      w.k = kv.data();
      w.v = kv.data();
    }
    w.scale = 0.125f;
    w.out = out.data();
    w.lse = lse.data();
    w.lengths = &length;
    w.splits = &splits;
    w.done = &waiter;
    engine.submit(&w);
    PAGODA_RETURN_IF_ERROR(waiter.wait());
    return static_cast<double>(out[0]);
  }
};

TEST(EngineCacheStress, ConcurrentAppendsForksTruncatesAndFreesStayExact) {
  const CacheGeometry g = geometry();
  FakeBackend backend(g);
  CacheManager cache(g);
  EngineOptions options;
  options.max_batch = 8;
  options.max_batch_wait_us = 20;
  options.workers = 2;
  auto engine = Engine::create(backend, cache, options);
  ASSERT_TRUE(engine.ok()) << engine.status().message();

  // A shared prefix of 6 tokens (a partly filled second block) in every layer.
  const SequenceId base = cache.create("base");
  double base_sum[3] = {0, 0, 0};
  {
    Caller c(**engine, g);
    for (int32_t layer = 0; layer < g.num_layers; ++layer) {
      for (int t = 0; t < 6; ++t) {
        ASSERT_TRUE(c.step(base, layer, 1.f + t, true).ok());
        base_sum[layer] += 1.0 + t;
      }
    }
  }

  constexpr int kClients = 6, kForkers = 3, kSteps = 60;
  std::atomic<int> failures{0};
  std::vector<std::thread> threads;
  for (int c = 0; c < kClients; ++c) {
    threads.emplace_back([&, c] {
      Caller caller(**engine, g);
      const SequenceId id = cache.create("client");
      double sum[3] = {0, 0, 0};
      for (int s = 0; s < kSteps; ++s) {
        const int32_t layer = s % g.num_layers;
        const float marker = static_cast<float>(c * 1000 + s);
        auto got = caller.step(id, layer, marker, true);
        sum[layer] += marker;
        if (!got.ok() || *got != sum[layer]) ++failures;
      }
      if (!cache.free(id).ok()) ++failures;
    });
  }
  for (int f = 0; f < kForkers; ++f) {
    threads.emplace_back([&, f] {
      Caller caller(**engine, g);
      for (int s = 0; s < kSteps / 2; ++s) {
        auto fork = cache.fork(base);
        if (!fork.ok()) {
          ++failures;
          continue;
        }
        const int32_t layer = (f + s) % g.num_layers;
        const float marker = static_cast<float>(100000 + f * 1000 + s);
        auto got = caller.step(*fork, layer, marker, true);  // writes into the shared partial block: a copy
        if (!got.ok() || *got != base_sum[layer] + marker) ++failures;
        auto base_now = caller.step(base, layer, 0.f, false);  // the prefix itself is untouched
        if (!base_now.ok() || *base_now != base_sum[layer]) ++failures;
        auto cut = cache.truncate(*fork, 5);
        if (!cut.ok()) ++failures;
        auto after = caller.step(*fork, layer, 0.f, false);
        double want = 0;
        for (int t = 0; t < 5; ++t) want += 1.0 + t;
        if (!after.ok() || *after != want) ++failures;
        if (!cache.free(*fork).ok()) ++failures;
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(failures.load(), 0);
  ASSERT_TRUE(cache.free(base).ok());
  EXPECT_EQ(cache.free_blocks(), cache.total_blocks()) << "blocks leaked or double-freed";
  EXPECT_EQ(cache.num_sequences(), 0u);
}

}  // namespace
}  // namespace pagoda::testing
