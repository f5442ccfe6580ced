#include "inprocess_decode.h"
#include "service_workload.h"

#include <chrono>
#include <numeric>
#include <vector>

#include <fmt/format.h>

#include "pagoda/backend.h"
#include "random_tensors.h"

namespace pagoda::bench {
namespace {

using Clock = std::chrono::steady_clock;

client::Error from_status(const Status& s, std::string_view what) {
  return client::Error(static_cast<client::ErrorCode>(s.code()), s.message(), std::string(what));
}

}  // namespace

client::Result<InprocessResult> measure_inprocess(const client::ServerConfig& config,
                                                  const InprocessShape& shape) {
  // Sequence b owns blocks [b * per_seq, (b + 1) * per_seq), one layer is enough.
  const int32_t per_seq = (shape.context + config.block_size - 1) / config.block_size;
  BackendOptions options;
  options.kind = shape.backend;
  options.cpu_threads = shape.threads;
  options.max_batch = shape.batch;
  options.geometry = CacheGeometry{.num_layers = 1, .num_q_heads = config.num_q_heads,
                                   .num_kv_heads = config.num_kv_heads, .head_dim = config.head_dim,
                                   .block_size = config.block_size,
                                   .num_blocks = std::max(1, per_seq * shape.batch),
                                   .dtype = config.cache_dtype, .v_head_dim = config.v_head_dim};
  auto backend = make_backend(options);
  if (!backend.ok()) return from_status(backend.status(), "make_backend");
  auto stream = (*backend)->open_stream();
  if (!stream.ok()) return from_status(stream.status(), "open_stream");
  BackendStream& be = **stream;

  // Fill every sequence's `context` tokens with random K/V, one write per sequence.
  client::RandomTensors rng(11);
  const auto k = rng.normal(static_cast<int64_t>(shape.context) * config.kv_row());
  const auto v = rng.normal(static_cast<int64_t>(shape.context) * config.kv_row());
  std::vector<int64_t> slots(shape.context);
  for (int32_t b = 0; b < shape.batch; ++b) {
    for (int32_t t = 0; t < shape.context; ++t)
      slots[t] = flat_slot(b * per_seq + t / config.block_size, t % config.block_size, config.block_size);
    const KvWrite w{.layer = 0, .num_tokens = shape.context, .slots = slots.data(), .k = k.data(),
                    .v = config.latent() ? nullptr : v.data(), .dtype = DType::kFloat32};
    if (Status s = be.write_kv(std::span<const KvWrite>(&w, 1)); !s.ok()) return from_status(s, "write_kv");
  }

  std::vector<int32_t> indptr(shape.batch + 1), ids(static_cast<size_t>(per_seq) * shape.batch),
      lengths(shape.batch, shape.context);
  for (int32_t b = 0; b <= shape.batch; ++b) indptr[b] = b * per_seq;
  std::iota(ids.begin(), ids.end(), 0);
  const int32_t q_len = std::min(shape.q_len, std::max(shape.context, 1));
  const int64_t rows = static_cast<int64_t>(shape.batch) * q_len;
  const auto q = rng.normal(rows * config.q_row());
  std::vector<float> out(static_cast<size_t>(rows * config.out_row()));  // [rows, q_heads, v_head_dim]
  std::vector<float> lse(static_cast<size_t>(rows) * config.num_q_heads);  // [rows, q_heads]
  std::vector<int32_t> q_indptr(shape.batch + 1);
  for (int32_t b = 0; b <= shape.batch; ++b) q_indptr[b] = b * q_len;
  std::vector<int32_t> splits(shape.batch);
  DecodeLaunch launch{.layer = 0,
                      .tables = {shape.batch, indptr.data(), ids.data(), lengths.data()},
                      .q = q.data(),
                      .q_dtype = DType::kFloat32,
                      .scale = 1.f / std::sqrt(static_cast<float>(config.head_dim)),
                      .mode = config.deterministic ? SplitMode::kDeterministic : SplitMode::kFast,
                      .split_tokens = config.split_tokens > 0 ? config.split_tokens : 512};
  launch.q_indptr = q_len > 1 ? q_indptr.data() : nullptr;
  launch.sliding_window = shape.window;
  DecodeOutputs outputs{.out = out.data(), .lse = lse.data(), .splits = splits.data()};

  std::vector<double> latencies;
  for (int i = 0; i < 3; ++i)  // warm caches and the thread pool
    if (Status s = be.decode(launch, outputs); !s.ok()) return from_status(s, "decode");
  const auto start = Clock::now();
  while (static_cast<int64_t>(latencies.size()) < shape.min_iters ||
         std::chrono::duration<double>(Clock::now() - start).count() < shape.min_seconds) {
    const auto t0 = Clock::now();
    if (Status s = be.decode(launch, outputs); !s.ok()) return from_status(s, "decode");
    latencies.push_back(std::chrono::duration<double, std::micro>(Clock::now() - t0).count());
  }
  InprocessResult r;
  r.context = shape.context;
  r.latency = summarize(latencies);
  r.device = (*backend)->device_name();
  const double mean_s = r.latency.mean_us * 1e-6;
  const double kv_bytes = static_cast<double>(shape.batch) * attended_keys(shape.context, q_len, shape.window) *
                          2.0 * config.kv_row() * static_cast<double>(dtype_size(config.cache_dtype));
  r.sequences_per_s = shape.batch / mean_s;
  r.kv_bytes_per_s = kv_bytes / mean_s;
  return r;
}

}  // namespace pagoda::bench
