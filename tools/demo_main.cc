// pagoda-demo: the batching engine in one process, without the gRPC service.
// Creates sequences, appends random K/V through the engine (AppendKV's path),
// then decodes steps that append each sequence's new token (Decode's path,
// one request per sequence, coalesced by the engine into one launch), and
// prints outputs, batching and timing.
#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include <chrono>
#include <cmath>
#include <future>
#include <memory>
#include <random>
#include <vector>

#include "cache/cache_manager.h"
#include "engine/engine.h"
#include "pagoda/backend.h"

namespace {

// Blocks until the engine reports the work item done.
class Waiter final : public pagoda::WorkDone {
 public:
  void work_done(const pagoda::Status& status) override { promise_.set_value(status); }
  pagoda::Status wait() { return promise_.get_future().get(); }

 private:
  std::promise<pagoda::Status> promise_;
};

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"pagoda-demo: the batching engine in process (append, decode, batching, timing)"};
  pagoda::BackendOptions opts;
  opts.kind = "cpu";
  opts.geometry = {/*layers*/ 2, /*q_heads*/ 8, /*kv_heads*/ 2, /*head_dim*/ 128, /*block_size*/ 16,
                   /*num_blocks*/ 4096, pagoda::DType::kFloat16};
  int32_t batch = 4, context = 1024, steps = 5;
  pagoda::EngineOptions engine_options;
  app.add_option("--batch", batch, "sequences, one Decode request each, coalesced by the engine")
      ->check(CLI::Range(1, 256));
  app.add_option("--context", context, "tokens of K/V per sequence")->check(CLI::Range(0, 16384));
  app.add_option("--steps", steps, "decode steps")->check(CLI::Range(1, 1000));
  app.add_option("--threads", opts.cpu_threads, "CPU threads (0 = all cores)");
  app.add_option("--backend", opts.kind, "cpu, cuda or auto");
  app.add_option("--split-tokens", engine_options.split_tokens, "split-KV chunk length");
  CLI11_PARSE(app, argc, argv);
  engine_options.max_batch = batch;
  engine_options.max_batch_wait_us = 1000;  // the demo's requests arrive together

  auto backend = pagoda::make_backend(opts);
  if (!backend.ok()) {
    fmt::print(stderr, "pagoda-demo: {}\n", backend.status().message());
    return 2;
  }
  const pagoda::CacheGeometry& g = (*backend)->geometry();
  pagoda::CacheManager cache(g);
  auto engine = pagoda::Engine::create(**backend, cache, engine_options);
  if (!engine.ok()) {
    fmt::print(stderr, "pagoda-demo: {}\n", engine.status().message());
    return 1;
  }
  fmt::print("backend {} on {}\n", (*backend)->name(), (*backend)->device_name());
  fmt::print("geometry: {} layers, {} q heads, {} kv heads, head_dim {}, block {}, {} blocks of {}\n", g.num_layers,
             g.num_q_heads, g.num_kv_heads, g.head_dim, g.block_size, g.num_blocks, pagoda::dtype_name(g.dtype));

  std::mt19937 rng(1);
  std::normal_distribution<float> normal(0.f, 1.f);
  auto random_rows = [&](int32_t n, int32_t heads) {
    std::vector<float> v(static_cast<size_t>(n) * heads * g.head_dim);
    for (float& x : v) x = normal(rng);
    return v;
  };

  std::vector<pagoda::SequenceId> ids;
  for (int32_t b = 0; b < batch; ++b) {
    ids.push_back(cache.create(fmt::format("demo-{}", b)));
    for (int32_t layer = 0; layer < g.num_layers; ++layer) {
      const auto k = random_rows(context, g.num_kv_heads), v = random_rows(context, g.num_kv_heads);
      pagoda::AppendWork work;
      Waiter waiter;
      work.id = ids.back();
      work.layer = layer;
      work.num_tokens = context;
      work.k = k.data();
      work.v = v.data();
      work.done = &waiter;
      (*engine)->submit(&work);
      if (const pagoda::Status s = waiter.wait(); !s.ok()) {
        fmt::print(stderr, "pagoda-demo: append: {}\n", s.message());
        return 1;
      }
    }
  }
  fmt::print("{} sequences x {} tokens appended; {} of {} blocks free\n", batch, context, cache.free_blocks(),
             cache.total_blocks());

  const auto rows = static_cast<size_t>(g.num_q_heads) * g.head_dim;
  for (int32_t step = 0; step < steps; ++step) {
    // One request per sequence, all submitted before any is answered.
    const auto q = random_rows(batch, g.num_q_heads);
    const auto k = random_rows(batch, g.num_kv_heads), v = random_rows(batch, g.num_kv_heads);
    std::vector<float> out(static_cast<size_t>(batch) * rows), lse(static_cast<size_t>(batch) * g.num_q_heads);
    std::vector<int32_t> lengths(batch), splits(batch);
    std::vector<std::unique_ptr<pagoda::DecodeWork>> works;
    std::vector<std::unique_ptr<Waiter>> waiters;
    const auto t0 = std::chrono::steady_clock::now();
    for (int32_t b = 0; b < batch; ++b) {
      auto w = std::make_unique<pagoda::DecodeWork>();
      waiters.push_back(std::make_unique<Waiter>());
      w->layer = 0;
      w->ids = std::span<const pagoda::SequenceId>(&ids[static_cast<size_t>(b)], 1);
      w->q = q.data() + b * rows;
      w->k = k.data() + static_cast<size_t>(b) * g.num_kv_heads * g.head_dim;
      w->v = v.data() + static_cast<size_t>(b) * g.num_kv_heads * g.head_dim;
      w->scale = 1.f / std::sqrt(static_cast<float>(g.head_dim));
      w->out = out.data() + b * rows;
      w->lse = lse.data() + static_cast<size_t>(b) * g.num_q_heads;
      w->lengths = &lengths[static_cast<size_t>(b)];
      w->splits = &splits[static_cast<size_t>(b)];
      w->done = waiters.back().get();
      works.push_back(std::move(w));
    }
    (*engine)->note_arriving();  // the requests arrive together: let them batch
    for (auto& w : works) (*engine)->submit(w.get());
    (*engine)->note_arrived();
    for (auto& waiter : waiters) {
      if (const pagoda::Status s = waiter->wait(); !s.ok()) {
        fmt::print(stderr, "pagoda-demo: decode: {}\n", s.message());
        return 1;
      }
    }
    const double us = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count();
    const double bytes = static_cast<double>(lengths[0]) * batch * static_cast<double>(g.token_kv_bytes());
    fmt::print("step {}: length {}, {} splits, out[0][0][:4] = [{:.4f} {:.4f} {:.4f} {:.4f}], lse[0][0] = {:.4f}, "
               "{:.0f} us ({:.2f} GB/s of K/V, compute {:.0f} us)\n",
               step, lengths[0], splits[0], out[0], out[1], out[2], out[3], lse[0], us, bytes / us / 1e3,
               works[0]->compute_us);
  }
  const pagoda::Engine::Counters c = (*engine)->counters();
  fmt::print("engine: {} launches for {} sequences decoded (largest batch {})\n", c.launches, c.sequences,
             c.largest_batch);
  return 0;
}
