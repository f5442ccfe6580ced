#include "service_bench.h"

#include <algorithm>
#include <cmath>
#include <memory>

#include <fmt/format.h>

#include "inprocess_decode.h"
#include "pagoda/client/client.h"
#include "report.h"
#include "service_workload.h"

namespace pagoda::bench {
namespace {

struct ServiceBenchArgs {
  client::ConnectionFlags server;
  std::string mode = "both";  // unary, stream, both
  std::string dtype = "fp32"; // wire dtype of q, k, v
  WorkloadShape shape;
  bool baseline = true;       // GetConfig round trips for the p50 ratio
  bool inprocess = true;      // the in-process kernel for the throughput ratio
  int32_t rounds = 3;         // service / in-process rounds, interleaved
  int32_t inprocess_threads = 0;
  int32_t v_head_dim = 0;     // > 0: the server must serve this v_head_dim (the shape being measured)
  bool json = false;
};

// One mode in `rounds` interleaved rounds: service calls, then the in-process
// kernel on the same batch at the mean length those calls attended over (each
// call may append a token, so lengths grow). The ratio is the median of the
// rounds' ratios: on a shared machine a neighbour's burst then skews one round,
// not the figure.
ModeReport run_mode(const ServiceBenchArgs& a, const client::ServerConfig& config,
                    const WorkloadShape& shape, const std::vector<ClientSequences>& seqs, CallMode mode) {
  const int32_t rounds = a.inprocess ? a.rounds : 1;
  WorkloadShape round_shape = shape;
  round_shape.steps = std::max<int64_t>(1, shape.steps / rounds);
  round_shape.duration_s = shape.duration_s / rounds;
  RunResult total;
  total.mode = mode;
  std::vector<std::pair<double, InprocessResult>> ratios;  // [rounds] ratio and its in-process run
  for (int32_t r = 0; r < rounds; ++r) {
    RunResult run = run_clients(a.server, config, round_shape, seqs, mode);
    const double ctx = mean_context(run, config);
    const double service_rate = run.wall_s > 0 ? static_cast<double>(run.sequences) / run.wall_s : 0;
    accumulate(total, std::move(run));
    if (!a.inprocess || total.errors) continue;
    const InprocessShape ishape{.backend = config.backend, .batch = shape.batch,
                                .context = static_cast<int32_t>(std::lround(ctx)),
                                .q_len = shape.q_len, .window = shape.window,
                                .threads = a.inprocess_threads, .min_seconds = 0.3};
    auto inproc = measure_inprocess(config, ishape);
    if (!inproc.ok()) {
      fmt::print(stderr, "warning: in-process baseline: {}\n", inproc.error().to_string());
      continue;
    }
    ratios.emplace_back(service_rate / inproc->sequences_per_s, *inproc);
  }
  ModeReport m = make_mode_report(total, config);
  if (!ratios.empty()) {
    std::sort(ratios.begin(), ratios.end(), [](const auto& x, const auto& y) { return x.first < y.first; });
    for (const auto& [ratio, inproc] : ratios) m.round_ratios.push_back(ratio);
    const auto& median = ratios[ratios.size() / 2];
    m.service_over_inprocess = median.first;
    m.inprocess = median.second;
  }
  return m;
}

int run(const ServiceBenchArgs& a) {
  auto c = a.server.connect();
  auto config = c->config();
  if (!config.ok()) {
    fmt::print(stderr, "error: {}\n", config.error().to_string());
    return 1;
  }
  if (a.v_head_dim > 0 && a.v_head_dim != config->v_head_dim) {
    fmt::print(stderr, "error: --v-head-dim: expected the server's v_head_dim ({}, head_dim {}), received {}\n",
               config->v_head_dim, config->head_dim, a.v_head_dim);
    return 2;
  }
  WorkloadShape shape = a.shape;
  shape.dtype = parse_dtype(a.dtype).value_or(DType::kFloat32);  // checked by the flag
  if (shape.layers > config->num_layers) {
    fmt::print(stderr, "error: --layers: expected at most the server's {} layers, received {}\n",
               config->num_layers, shape.layers);
    return 2;
  }
  // Every warm-up or measured step appends a token to each sequence of one layer.
  const int64_t growth = shape.append ? (shape.warmup * a.rounds + shape.steps) / shape.layers + 1 : 0;
  const int64_t blocks_per_seq = (shape.context + growth + config->block_size - 1) / config->block_size;
  const int64_t need = blocks_per_seq * shape.batch * shape.clients;
  if (shape.duration_s == 0 && need > config->free_blocks) {
    fmt::print(stderr, "error: the run needs about {} cache blocks, the server has {} free\n", need,
               config->free_blocks);
    return 2;
  }

  ServiceReport report;
  report.server = a.server.server;
  report.config = *config;
  report.shape = shape;
  double getconfig_p50 = 0;
  if (a.baseline) {
    const std::vector<ClientSequences> none(shape.clients);
    RunResult run = run_clients(a.server, *config, shape, none, CallMode::kGetConfig);
    report.modes.push_back(make_mode_report(run, *config));
    getconfig_p50 = report.modes.back().latency.p50_us;
  }
  double unary_calls = 0, stream_calls = 0;
  for (CallMode mode : {CallMode::kUnary, CallMode::kStream}) {
    if (a.mode != "both" && a.mode != call_mode_name(mode)) continue;
    // Fresh sequences per mode, so that both start from the same context.
    auto seqs = prepare_sequences(*c, *config, shape);
    if (!seqs.ok()) {
      fmt::print(stderr, "error: preparing sequences: {}\n", seqs.error().to_string());
      return 1;
    }
    ModeReport m = run_mode(a, *config, shape, *seqs, mode);
    free_sequences(*c, *seqs);
    if (getconfig_p50 > 0) m.p50_over_getconfig = m.latency.p50_us / getconfig_p50;
    (mode == CallMode::kUnary ? unary_calls : stream_calls) = m.calls_per_s;
    report.modes.push_back(std::move(m));
  }
  if (unary_calls > 0 && stream_calls > 0) report.stream_over_unary_calls = stream_calls / unary_calls;

  if (a.json) print_json(report);
  else print_table(report);
  int64_t errors = 0;
  for (const ModeReport& m : report.modes) errors += m.errors;
  return errors == 0 ? 0 : 1;
}

}  // namespace

void add_service_command(CLI::App& app, int& exit_code) {
  auto a = std::make_shared<ServiceBenchArgs>();
  auto* sub = app.add_subcommand("service", "Decode latency and throughput over gRPC (loopback or remote)");
  a->server.add_to(*sub);
  sub->add_option("--clients", a->shape.clients, "Concurrent clients (threads, one channel each)")
      ->check(CLI::PositiveNumber)->capture_default_str();
  sub->add_option("--mode", a->mode, "unary, stream or both")
      ->check(CLI::IsMember({"unary", "stream", "both"}))->capture_default_str();
  sub->add_option("--batch", a->shape.batch, "Sequences per Decode call")->check(CLI::PositiveNumber)->capture_default_str();
  sub->add_option("--context", a->shape.context, "Tokens cached per sequence and layer before the run")
      ->check(CLI::NonNegativeNumber)->capture_default_str();
  sub->add_option("--layers", a->shape.layers, "Layers the calls cycle through")->check(CLI::PositiveNumber)->capture_default_str();
  sub->add_option("--steps", a->shape.steps, "Measured calls per client and mode")->check(CLI::PositiveNumber)->capture_default_str();
  sub->add_option("--duration", a->shape.duration_s, "Measured seconds per mode (overrides --steps)")
      ->check(CLI::NonNegativeNumber)->capture_default_str();
  sub->add_option("--warmup", a->shape.warmup, "Unmeasured calls per client first")->check(CLI::NonNegativeNumber)->capture_default_str();
  sub->add_flag("!--no-append", a->shape.append,
                "Decode without appending k/v, so that lengths stay at --context (a fixed shape)");
  sub->add_option("--in-flight", a->shape.in_flight, "Stream: requests in flight per stream (pipelining)")
      ->check(CLI::PositiveNumber)->capture_default_str();
  sub->add_option("--q-len", a->shape.q_len,
                  "Query rows per sequence and call (draft verification); each appends as many tokens")
      ->check(CLI::Range(1, 1024))->capture_default_str();
  sub->add_flag("--shared-prefix", a->shape.shared_prefix,
               "Each client's sequences are forks of one parent holding the context (ForkSequence count): whole "
               "chunks are shared and read once");
  sub->add_flag("--shared-memory", a->shape.shared_memory,
                "q, k, v and the output in a registered POSIX shared-memory region per client (the server needs "
                "--allow-shared-memory): calls carry references instead of tensor bytes");
  sub->add_option("--window", a->shape.window, "Sliding window of every call (0 = none)")
      ->check(CLI::NonNegativeNumber)->capture_default_str();
  sub->add_option("--dtype", a->dtype, "Wire dtype of q, k, v")
      ->check(CLI::IsMember({"fp32", "fp16", "bf16"}))->capture_default_str();
  sub->add_flag("!--no-baseline", a->baseline, "Skip the GetConfig round-trip baseline");
  sub->add_flag("!--no-inprocess", a->inprocess, "Skip the in-process kernel baseline");
  sub->add_option("--rounds", a->rounds,
                  "Interleaved service / in-process rounds per mode (the ratio is their median)")
      ->check(CLI::PositiveNumber)->capture_default_str();
  sub->add_option("--inprocess-threads", a->inprocess_threads, "In-process backend threads (0 = all cores)")
      ->capture_default_str();
  sub->add_option("--v-head-dim", a->v_head_dim,
                  "The v_head_dim the server must serve (0 = any): 512 with head_dim 576 measures latent attention "
                  "(k-only appends, V the prefix of K's rows); the geometry itself is the server's")
      ->check(CLI::NonNegativeNumber)->capture_default_str();
  sub->add_flag("--json", a->json, "Print JSON instead of a table");
  sub->callback([a, &exit_code] { exit_code = run(*a); });
}

}  // namespace pagoda::bench
