#include "report.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

namespace pagoda::bench {
namespace {

// A JSON string literal (names and error messages are the only strings).
std::string quoted(const std::string& s) {
  std::string out = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') out += '\\';
    if (static_cast<unsigned char>(c) < 0x20) {
      out += fmt::format("\\u{:04x}", c);
      continue;
    }
    out += c;
  }
  return out + "\"";
}

std::string latency_json(const LatencySummary& l) {
  return fmt::format(R"({{"count": {}, "mean_us": {:.2f}, "p50_us": {:.2f}, "p90_us": {:.2f}, "p99_us": {:.2f}, "max_us": {:.2f}}})",
                     l.count, l.mean_us, l.p50_us, l.p90_us, l.p99_us, l.max_us);
}

}  // namespace

ModeReport make_mode_report(RunResult& run, const client::ServerConfig& config) {
  ModeReport m;
  m.mode = call_mode_name(run.mode);
  m.latency = summarize(run.latencies_us);
  m.calls = run.calls;
  m.mean_context = mean_context(run, config);
  if (run.wall_s > 0) {
    m.calls_per_s = static_cast<double>(run.calls) / run.wall_s;
    m.sequences_per_s = static_cast<double>(run.sequences) / run.wall_s;
    m.kv_bytes_per_s = static_cast<double>(run.kv_bytes) / run.wall_s;
  }
  m.server_queue_us = run.server_queue_us;
  m.server_compute_us = run.server_compute_us;
  m.server_total_us = run.server_total_us;
  if (run.server_total_us > 0) m.outside_server_us = m.latency.mean_us - run.server_total_us;
  m.errors = run.errors;
  m.first_error = run.first_error;
  return m;
}

void print_table(const ServiceReport& r) {
  const auto& c = r.config;
  const auto& s = r.shape;
  fmt::print("server {} ({} backend, {}): {} q / {} kv heads, head_dim {}, v_head_dim {}, cache {}, block {}, "
             "split {}, max batch {} / wait {} us\n",
             r.server, c.backend, c.device_name, c.num_q_heads, c.num_kv_heads, c.head_dim, c.v_head_dim,
             dtype_name(c.cache_dtype), c.block_size, c.split_tokens, c.max_batch, c.max_batch_wait_us);
  fmt::print("shape: clients {}, batch {}, context {}, layers {}, in_flight {}, wire dtype {}, {}{}\n\n",
             s.clients, s.batch, s.context, s.layers, s.in_flight, dtype_name(s.dtype),
             s.append ? "each call appends one token per sequence" : "no appends",
             s.shared_memory ? ", tensors in shared memory" : "");
  const auto header = "{:<11} {:>7} {:>6} {:>8} {:>8} {:>8} {:>8} {:>9} {:>9} {:>8} {:>8} {:>8} {:>8} {:>8} {:>8}\n";
  fmt::print(fmt::runtime(header), "mode", "calls", "ctx", "p50 us", "p90 us", "p99 us", "mean us",
             "calls/s", "seqs/s", "KV GB/s", "srv q us", "srv c us", "srv t us", "out us", "svc/inpr");
  const auto row = "{:<11} {:>7} {:>6.0f} {:>8.1f} {:>8.1f} {:>8.1f} {:>8.1f} {:>9.0f} {:>9.0f} {:>8.3f} {:>8} {:>8} {:>8} {:>8} {:>8}\n";
  auto opt = [](double v, const char* f) { return v > 0 ? fmt::format(fmt::runtime(f), v) : std::string("-"); };
  for (const ModeReport& m : r.modes) {
    fmt::print(fmt::runtime(row), m.mode, m.latency.count, m.mean_context, m.latency.p50_us,
               m.latency.p90_us, m.latency.p99_us, m.latency.mean_us, m.calls_per_s, m.sequences_per_s,
               m.kv_bytes_per_s / 1e9, opt(m.server_queue_us, "{:.1f}"), opt(m.server_compute_us, "{:.1f}"),
               opt(m.server_total_us, "{:.1f}"), opt(m.outside_server_us, "{:.1f}"),
               opt(m.service_over_inprocess, "{:.3f}"));
    if (m.errors) fmt::print("  {} errors, first: {}\n", m.errors, m.first_error);
    if (m.inprocess) {
      const auto& i = *m.inprocess;
      fmt::print(fmt::runtime(row), "  in-proc", i.latency.count, static_cast<double>(i.context), i.latency.p50_us,
                 i.latency.p90_us, i.latency.p99_us, i.latency.mean_us, 1e6 / i.latency.mean_us,
                 i.sequences_per_s, i.kv_bytes_per_s / 1e9, "", "", "", "", "");
    }
  }
  fmt::print("(srv q/c/t: the server's own queue, compute and total time per call, means; out: mean\n"
             " latency minus srv t, i.e. client + gRPC + loopback)\n\n");
  for (const ModeReport& m : r.modes)
    if (m.p50_over_getconfig > 0)
      fmt::print("{} p50 / GetConfig p50 (same channel): {:.2f}\n", m.mode, m.p50_over_getconfig);
  if (r.stream_over_unary_calls > 0)
    fmt::print("stream / unary throughput (calls/s): {:.2f}\n", r.stream_over_unary_calls);
  for (const ModeReport& m : r.modes)
    if (m.service_over_inprocess > 0)
      fmt::print("{} service / in-process throughput (sequences/s): {:.3f} (median of rounds [{:.3f}])\n",
                 m.mode, m.service_over_inprocess, fmt::join(m.round_ratios, ", "));
}

void print_json(const ServiceReport& r) {
  const auto& c = r.config;
  const auto& s = r.shape;
  fmt::print("{{\n  \"server\": {},\n", quoted(r.server));
  fmt::print(R"(  "config": {{"backend": {}, "device": {}, "num_q_heads": {}, "num_kv_heads": {}, "head_dim": {}, "block_size": {}, "cache_dtype": "{}", "split_tokens": {}, "deterministic": {}, "max_batch": {}, "max_batch_wait_us": {}}},)" "\n",
             quoted(c.backend), quoted(c.device_name), c.num_q_heads, c.num_kv_heads, c.head_dim,
             c.block_size, dtype_name(c.cache_dtype), c.split_tokens, c.deterministic, c.max_batch,
             c.max_batch_wait_us);
  fmt::print(R"(  "shape": {{"clients": {}, "batch": {}, "context": {}, "layers": {}, "in_flight": {}, "dtype": "{}", "append": {}, "shared_memory": {}}},)" "\n",
             s.clients, s.batch, s.context, s.layers, s.in_flight, dtype_name(s.dtype), s.append, s.shared_memory);
  fmt::print("  \"modes\": [\n");
  for (size_t i = 0; i < r.modes.size(); ++i) {
    const ModeReport& m = r.modes[i];
    std::string inproc = "null";
    if (m.inprocess) {
      inproc = fmt::format(R"({{"device": {}, "context": {}, "latency": {}, "sequences_per_s": {:.2f}, "kv_bytes_per_s": {:.0f}, "round_ratios": [{:.4f}]}})",
                           quoted(m.inprocess->device), m.inprocess->context, latency_json(m.inprocess->latency),
                           m.inprocess->sequences_per_s, m.inprocess->kv_bytes_per_s,
                           fmt::join(m.round_ratios, ", "));
    }
    fmt::print(R"(    {{"mode": "{}", "calls": {}, "mean_context": {:.1f}, "latency": {}, "calls_per_s": {:.2f}, "sequences_per_s": {:.2f}, "kv_bytes_per_s": {:.0f}, "server_queue_us": {:.2f}, "server_compute_us": {:.2f}, "server_total_us": {:.2f}, "outside_server_us": {:.2f}, "inprocess": {}, "service_over_inprocess": {:.4f}, "p50_over_getconfig": {:.4f}, "errors": {}, "first_error": {}}}{})" "\n",
               m.mode, m.calls, m.mean_context, latency_json(m.latency), m.calls_per_s, m.sequences_per_s,
               m.kv_bytes_per_s, m.server_queue_us, m.server_compute_us, m.server_total_us, m.outside_server_us, inproc,
               m.service_over_inprocess, m.p50_over_getconfig, m.errors, quoted(m.first_error),
               i + 1 < r.modes.size() ? "," : "");
  }
  fmt::print("  ],\n");
  fmt::print("  \"stream_over_unary_calls\": {:.4f}\n}}\n", r.stream_over_unary_calls);
}

}  // namespace pagoda::bench
