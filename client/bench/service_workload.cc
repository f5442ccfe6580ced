#include "service_workload.h"

#include <algorithm>
#include <cmath>
#include <chrono>
#include <deque>
#include <latch>
#include <thread>

#include <fmt/format.h>
#include <unistd.h>

#include "pagoda/key_ranges.h"
#include "random_tensors.h"
#include "shm_tensors.h"

namespace pagoda::bench {
namespace {

using Clock = std::chrono::steady_clock;

double micros(Clock::duration d) { return std::chrono::duration<double, std::micro>(d).count(); }

// What one client thread measured.
struct ThreadResult {
  std::vector<double> latencies_us;
  int64_t calls = 0;
  int64_t sequences = 0;
  int64_t kv_bytes = 0;
  int64_t length_sum = 0;
  double queue_us = 0, compute_us = 0, total_us = 0;  // sums
  int64_t errors = 0;
  std::string first_error;
  Clock::time_point done;

  void failed(const client::Error& e) {
    if (errors++ == 0) first_error = e.to_string();
  }
  void answered(const client::DecodeResult& r, const WorkloadShape& shape, int64_t token_kv_bytes,
                double latency_us, bool record) {
    if (!record) return;
    latencies_us.push_back(latency_us);
    ++calls;
    sequences += static_cast<int64_t>(r.lengths.size());
    for (int32_t len : r.lengths) {
      kv_bytes += attended_keys(len, shape.q_len, shape.window) * token_kv_bytes;
      length_sum += len;
    }
    queue_us += r.timing.queue_us;
    compute_us += r.timing.compute_us;
    total_us += r.timing.total_us;
  }
};

// When a phase stops: after `steps` calls, or at `deadline` when one is set.
struct PhaseEnd {
  int64_t steps = 0;
  std::optional<Clock::time_point> deadline;
  bool more(int64_t sent) const { return deadline ? Clock::now() < *deadline : sent < steps; }
};

// The tensors of one client's Decode calls, drawn once and reused every step
// (the values do not change the work).
struct StepTensors {
  std::vector<float> q, k, v;  // [batch, q_heads, head_dim], [batch, kv_heads, head_dim] x2
};

class ClientThread {
 public:
  ClientThread(client::Client& c, const client::ServerConfig& config, const WorkloadShape& shape,
               const ClientSequences& seqs, uint64_t seed)
      : client_(c), config_(config), shape_(shape), seqs_(seqs) {
    client::RandomTensors rng(seed);
    const int64_t rows = static_cast<int64_t>(shape.batch) * shape.q_len;
    tensors_.q = rng.normal(rows * config.q_row());
    tensors_.k = rng.normal(rows * config.kv_row());
    if (!config.latent()) tensors_.v = rng.normal(rows * config.kv_row());  // latent: V is k's prefix
    if (shape.q_len > 1) q_lengths_.assign(static_cast<size_t>(shape.batch), shape.q_len);
    token_kv_bytes_ = (config.latent() ? 1 : 2) * config.kv_row() * static_cast<int64_t>(dtype_size(config.cache_dtype));
    // Explicit, because a latent-attention server has no default scale.
    scale_ = 1.f / std::sqrt(static_cast<float>(config.head_dim));
  }

  client::DecodeArgs args(int64_t step) const {
    client::DecodeArgs a{.layer = static_cast<int32_t>(step % shape_.layers), .sequence_ids = seqs_.ids,
                         .q = tensors_.q, .k = kv(tensors_.k), .v = kv(tensors_.v), .q_dtype = shape_.dtype,
                         .kv_dtype = shape_.dtype, .scale = scale_};
    a.q_lengths = q_lengths_;
    a.sliding_window = shape_.window;
    if (shm_) shm_->name_in(a);
    return a;
  }

  // Moves this client's tensors into a registered region `name` (--shared-memory).
  client::Outcome use_shared_memory(const std::string& name) {
    const int64_t out_elems = static_cast<int64_t>(tensors_.q.size());  // the output has q's shape and dtype
    auto placed = ShmTensors::place(client_, name, tensors_.q, kv(tensors_.k), kv(tensors_.v), out_elems, shape_.dtype);
    if (!placed.ok()) return placed.error();
    shm_.emplace(std::move(*placed));
    return client::Done{};
  }

  std::span<const float> kv(const std::vector<float>& t) const {
    return shape_.append ? std::span<const float>(t) : std::span<const float>();
  }

  void unary(const PhaseEnd& end, bool record, ThreadResult& out) {
    for (int64_t i = 0; end.more(i) && out.errors == 0; ++i) {
      const auto t0 = Clock::now();
      auto r = client_.decode(args(i));
      const double us = micros(Clock::now() - t0);
      if (!r.ok()) out.failed(r.error());
      else out.answered(*r, shape_, token_kv_bytes_, us, record);
    }
  }

  void get_config(const PhaseEnd& end, bool record, ThreadResult& out) {
    for (int64_t i = 0; end.more(i) && out.errors == 0; ++i) {
      const auto t0 = Clock::now();
      auto r = client_.refresh_config();
      const double us = micros(Clock::now() - t0);
      if (!r.ok()) {
        out.failed(r.error());
      } else if (record) {
        out.latencies_us.push_back(us);
        ++out.calls;
      }
    }
  }

  // Keeps `shape.in_flight` requests in flight on the stream; latency of each is
  // from its send to its response.
  void stream(client::DecodeStream& s, const PhaseEnd& end, bool record, ThreadResult& out) {
    std::deque<Clock::time_point> sent;
    int64_t sent_n = 0;
    while (out.errors == 0) {
      while (static_cast<int32_t>(sent.size()) < shape_.in_flight && end.more(sent_n)) {
        auto id = s.send(args(sent_n++));
        if (!id.ok()) {
          out.failed(id.error());
          return;
        }
        sent.push_back(Clock::now());
      }
      if (sent.empty()) return;
      auto r = s.receive();
      const double us = micros(Clock::now() - sent.front());
      sent.pop_front();
      if (!r.ok()) out.failed(r.error());
      else out.answered(*r, shape_, token_kv_bytes_, us, record);
    }
  }

 private:
  client::Client& client_;
  client::ServerConfig config_;
  WorkloadShape shape_;
  const ClientSequences& seqs_;
  StepTensors tensors_;
  int64_t token_kv_bytes_ = 0;
  float scale_ = 0.f;
  std::vector<int32_t> q_lengths_;  // [batch] q_len each, or empty for one row
  std::optional<ShmTensors> shm_;   // --shared-memory: where q, k, v and the output lie
};

}  // namespace

const char* call_mode_name(CallMode m) {
  switch (m) {
    case CallMode::kUnary: return "unary";
    case CallMode::kStream: return "stream";
    case CallMode::kGetConfig: return "getconfig";
  }
  return "?";
}

client::Result<std::vector<ClientSequences>> prepare_sequences(client::Client& c,
                                                               const client::ServerConfig& config,
                                                               const WorkloadShape& shape) {
  // Chunks of AppendKV that stay well under the server's receive limit.
  const int64_t token_bytes =
      (config.latent() ? 1 : 2) * config.kv_row() * static_cast<int64_t>(dtype_size(shape.dtype));
  const int64_t limit = config.max_message_bytes > 0 ? config.max_message_bytes : (4 << 20);
  const int64_t chunk = std::clamp<int64_t>(limit / 2 / token_bytes, 1, std::max(shape.context, 1));
  client::RandomTensors rng(7);
  const auto k = rng.normal(chunk * config.kv_row());
  const auto v = config.latent() ? std::vector<float>() : rng.normal(chunk * config.kv_row());  // latent: k alone

  auto filled = [&](const std::string& label) -> client::Result<uint64_t> {
    auto id = c.create_sequence(label);
    if (!id.ok()) return id.error();
    for (int32_t layer = 0; layer < shape.layers; ++layer) {
      for (int64_t done = 0; done < shape.context; done += chunk) {
        const auto n = static_cast<size_t>(std::min(chunk, shape.context - done) * config.kv_row());
        auto len = c.append_kv(*id, layer, std::span(k).first(n), std::span(v).first(v.empty() ? 0 : n), shape.dtype);
        if (!len.ok()) return len.error();
      }
    }
    return *id;
  };
  std::vector<ClientSequences> all(shape.clients);
  for (int32_t ci = 0; ci < shape.clients; ++ci) {
    if (shape.shared_prefix) {
      // The forks keep the parent's blocks; the parent itself is not decoded.
      auto parent = filled(fmt::format("bench-c{}-parent", ci));
      if (!parent.ok()) return parent.error();
      auto forks = c.fork_sequences(*parent, shape.batch);
      (void)c.free_sequence(*parent);
      if (!forks.ok()) return forks.error();
      all[ci].ids = *forks;
      continue;
    }
    for (int32_t b = 0; b < shape.batch; ++b) {
      auto id = filled(fmt::format("bench-c{}-s{}", ci, b));
      if (!id.ok()) return id.error();
      all[ci].ids.push_back(*id);
    }
  }
  return all;
}

void free_sequences(client::Client& c, const std::vector<ClientSequences>& seqs) {
  for (const ClientSequences& s : seqs)
    for (uint64_t id : s.ids) (void)c.free_sequence(id);
}

int64_t attended_keys(int32_t length, int32_t q_len, int32_t window) {
  if (length <= 0) return 0;
  const int32_t rows = q_len < length ? q_len : length;
  return length - row_keys(length, rows, 0, window).begin;
}

double mean_context(const RunResult& run, const client::ServerConfig& config) {
  (void)config;
  return run.sequences > 0 ? static_cast<double>(run.length_sum) / static_cast<double>(run.sequences) : 0.0;
}

void accumulate(RunResult& total, RunResult&& part) {
  const auto calls = static_cast<double>(total.calls + part.calls);
  auto weighted = [&](double a, double b) {
    return calls > 0 ? (a * static_cast<double>(total.calls) + b * static_cast<double>(part.calls)) / calls : 0.0;
  };
  total.server_queue_us = weighted(total.server_queue_us, part.server_queue_us);
  total.server_compute_us = weighted(total.server_compute_us, part.server_compute_us);
  total.server_total_us = weighted(total.server_total_us, part.server_total_us);
  total.latencies_us.insert(total.latencies_us.end(), part.latencies_us.begin(), part.latencies_us.end());
  total.wall_s += part.wall_s;
  total.calls += part.calls;
  total.sequences += part.sequences;
  total.kv_bytes += part.kv_bytes;
  total.length_sum += part.length_sum;
  total.errors += part.errors;
  if (total.first_error.empty()) total.first_error = part.first_error;
}

RunResult run_clients(const client::ConnectionFlags& server, const client::ServerConfig& config,
                      const WorkloadShape& shape, const std::vector<ClientSequences>& seqs,
                      CallMode mode) {
  std::vector<ThreadResult> results(shape.clients);
  std::latch warmed_up(shape.clients + 1);
  std::latch go(1);
  Clock::time_point start;
  std::optional<Clock::time_point> deadline;

  std::vector<std::thread> threads;
  for (int32_t ci = 0; ci < shape.clients; ++ci) {
    threads.emplace_back([&, ci] {
      ThreadResult& out = results[ci];
      auto c = server.connect();
      ClientThread worker(*c, config, shape, seqs[ci], 1000 + ci);
      if (shape.shared_memory && mode != CallMode::kGetConfig) {
        // One region per client, named by process and client (unique on the host).
        auto placed = worker.use_shared_memory(fmt::format("pagoda-bench-{}-c{}", getpid(), ci));
        if (!placed.ok()) out.failed(placed.error());
      }
      const PhaseEnd warm{shape.warmup, std::nullopt};
      std::unique_ptr<client::DecodeStream> stream;
      if (mode == CallMode::kStream) {
        auto s = c->open_stream();
        if (s.ok()) stream = std::move(*s);
        else out.failed(s.error());
      }
      auto phase = [&](const PhaseEnd& end, bool record) {
        if (out.errors) return;
        if (mode == CallMode::kUnary) worker.unary(end, record, out);
        else if (mode == CallMode::kGetConfig) worker.get_config(end, record, out);
        else worker.stream(*stream, end, record, out);
      };
      phase(warm, false);
      warmed_up.arrive_and_wait();
      go.wait();
      phase(PhaseEnd{shape.steps, deadline}, true);
      out.done = Clock::now();
      if (stream) {
        auto fin = stream->finish();
        if (!fin.ok()) out.failed(fin.error());
      }
    });
  }
  warmed_up.arrive_and_wait();
  start = Clock::now();
  if (shape.duration_s > 0)
    deadline = start + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(shape.duration_s));
  go.count_down();
  for (std::thread& t : threads) t.join();

  RunResult run;
  run.mode = mode;
  Clock::time_point last = start;
  for (ThreadResult& r : results) {
    run.latencies_us.insert(run.latencies_us.end(), r.latencies_us.begin(), r.latencies_us.end());
    run.calls += r.calls;
    run.sequences += r.sequences;
    run.kv_bytes += r.kv_bytes;
    run.length_sum += r.length_sum;
    run.server_queue_us += r.queue_us;
    run.server_compute_us += r.compute_us;
    run.server_total_us += r.total_us;
    run.errors += r.errors;
    if (run.first_error.empty()) run.first_error = r.first_error;
    last = std::max(last, r.done);
  }
  run.wall_s = std::chrono::duration<double>(last - start).count();
  if (run.calls > 0) {
    run.server_queue_us /= static_cast<double>(run.calls);
    run.server_compute_us /= static_cast<double>(run.calls);
    run.server_total_us /= static_cast<double>(run.calls);
  }
  return run;
}

}  // namespace pagoda::bench
