// pagoda-demo: the engine in one process, without the service. Creates
// sequences, appends random K/V, decodes a batch and prints outputs and timing.
#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include <chrono>
#include <cmath>
#include <random>
#include <vector>

#include "cache_manager.h"
#include "pagoda/backend.h"

int main(int argc, char** argv) {
  CLI::App app{"pagoda-demo: create sequences, append K/V and decode in process"};
  pagoda::BackendOptions opts;
  opts.kind = "cpu";
  opts.geometry = {/*layers*/ 2, /*q_heads*/ 8, /*kv_heads*/ 2, /*head_dim*/ 128, /*block_size*/ 16,
                   /*num_blocks*/ 4096, pagoda::DType::kFloat16};
  int32_t batch = 4, context = 1024, steps = 5, split_tokens = 512;
  app.add_option("--batch", batch, "sequences decoded together")->check(CLI::Range(1, 256));
  app.add_option("--context", context, "tokens of K/V per sequence")->check(CLI::Range(0, 16384));
  app.add_option("--steps", steps, "decode steps")->check(CLI::Range(1, 1000));
  app.add_option("--threads", opts.cpu_threads, "CPU threads (0 = all cores)");
  app.add_option("--split-tokens", split_tokens, "split-KV chunk length");
  CLI11_PARSE(app, argc, argv);

  auto backend = pagoda::make_backend(opts);
  if (!backend.ok()) {
    fmt::print(stderr, "pagoda-demo: {}\n", backend.status().message());
    return 2;
  }
  const pagoda::CacheGeometry& g = (*backend)->geometry();
  pagoda::CacheManager cache(**backend);
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
      auto len = cache.append(ids.back(), layer, context, k.data(), v.data(), pagoda::DType::kFloat32);
      if (!len.ok()) {
        fmt::print(stderr, "pagoda-demo: append: {}\n", len.status().message());
        return 1;
      }
    }
  }
  fmt::print("{} sequences x {} tokens appended; {} of {} blocks free\n", batch, context, cache.free_blocks(),
             cache.total_blocks());

  std::vector<float> out(static_cast<size_t>(batch) * g.num_q_heads * g.head_dim), lse(batch * g.num_q_heads);
  std::vector<int32_t> splits(batch);
  for (int32_t step = 0; step < steps; ++step) {
    const auto q = random_rows(batch, g.num_q_heads);
    const auto k = random_rows(batch, g.num_kv_heads), v = random_rows(batch, g.num_kv_heads);
    const auto t0 = std::chrono::steady_clock::now();
    const pagoda::AppendRows rows{1, k.data(), v.data(), pagoda::DType::kFloat32};
    auto lease = cache.acquire(0, ids, &rows);
    if (!lease.ok()) {
      fmt::print(stderr, "pagoda-demo: decode: {}\n", lease.status().message());
      return 1;
    }
    pagoda::DecodeLaunch launch;
    launch.tables = lease->tables();
    launch.q = q.data();
    launch.scale = 1.f / std::sqrt(static_cast<float>(g.head_dim));
    launch.split_tokens = split_tokens;
    pagoda::DecodeOutputs o{out.data(), lse.data(), splits.data()};
    if (auto s = (*backend)->decode(launch, o); !s.ok()) {
      fmt::print(stderr, "pagoda-demo: decode: {}\n", s.message());
      return 1;
    }
    const double us = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count();
    const double bytes = static_cast<double>(lease->lengths()[0]) * batch * g.token_kv_bytes();
    fmt::print("step {}: length {}, {} splits, out[0][0][:4] = [{:.4f} {:.4f} {:.4f} {:.4f}], lse[0][0] = {:.4f}, "
               "{:.0f} us ({:.2f} GB/s of K/V)\n",
               step, lease->lengths()[0], splits[0], out[0], out[1], out[2], out[3], lse[0], us, bytes / us / 1e3);
  }
  return 0;
}
