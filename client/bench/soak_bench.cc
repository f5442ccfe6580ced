#include "soak_bench.h"

#include <signal.h>

#include <chrono>
#include <condition_variable>
#include <fstream>
#include <sstream>
#include <string>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include <fmt/format.h>

#include "pagoda/client/client.h"
#include "soak_workload.h"

namespace pagoda::bench {
namespace {

using Clock = std::chrono::steady_clock;

struct SoakArgs {
  client::ConnectionFlags server;
  SoakShape shape;
  double sigterm_after_s = 0;  // 0: no SIGTERM
  int64_t server_pid = 0;
  // --revoke-after: client 0 connects with revoke_token, which is taken out of
  // tokens_file (the server's --auth-tokens) after this many seconds, then the
  // server is sent SIGHUP. 0: no revocation.
  double revoke_after_s = 0;
  std::string revoke_token;
  std::string tokens_file;
  bool json = false;
};

struct SoakReport {
  SoakCounts counts;
  double wall_s = 0;
  bool sigterm_sent = false;
  bool revocation_sent = false;
  int64_t failures = 0;
};

// Columns of the table: the outcomes a healthy run has, then everything else.
const std::vector<std::string> kColumns = {"ok", "retried", "replayed", "gave_up", "unavailable"};

void print_table(const SoakArgs& a, const client::ServerConfig& config, const SoakReport& r) {
  fmt::print("soak: {} clients x {} operations on {} ({} backend, {} layers, {} cache, {})\n", a.shape.clients,
             a.shape.calls, a.server.server, config.backend, config.num_layers, dtype_name(config.cache_dtype),
             config.deterministic ? "deterministic" : "fast");
  fmt::print("{:<27}", "operation");
  for (const auto& c : kColumns) fmt::print("{:>12}", c);
  fmt::print("  {}\n", "other");
  for (const auto& [op, by] : r.counts.outcomes) {
    fmt::print("{:<27}", op);
    for (const auto& c : kColumns) {
      auto it = by.find(c);
      fmt::print("{:>12}", it == by.end() ? 0 : it->second);
    }
    std::string other;
    for (const auto& [outcome, n] : by) {
      if (std::find(kColumns.begin(), kColumns.end(), outcome) == kColumns.end()) {
        other += fmt::format("{}{} {}", other.empty() ? "" : ", ", outcome, n);
      }
    }
    fmt::print("  {}\n", other.empty() ? "-" : other);
  }
  fmt::print("rpcs {} in {:.2f} s ({:.0f}/s)\n", r.counts.rpcs, r.wall_s, r.wall_s > 0 ? r.counts.rpcs / r.wall_s : 0);
  if (r.sigterm_sent) {
    fmt::print("SIGTERM sent to pid {} after {:.2f} s: final lengths not verified (the server is gone)\n",
               a.server_pid, a.sigterm_after_s);
  }
  if (r.revocation_sent) {
    fmt::print("token of client 0 revoked (SIGHUP to pid {}) after {:.2f} s; its {} sequences not verified\n",
               a.server_pid, a.revoke_after_s, r.counts.unverified_revoked);
  }
  fmt::print("sequences verified {}: lost {}, duplicates {}; decodes checked against the reference {}: "
             "mismatches {}\n",
             r.counts.verified_sequences, r.counts.lost, r.counts.duplicates, r.counts.checked_decodes,
             r.counts.mismatches);
  fmt::print("failures {}{}\n", r.failures,
             r.counts.first_problem.empty() ? "" : fmt::format(" (first: {})", r.counts.first_problem));
}

void print_json(const SoakArgs& a, const SoakReport& r) {
  std::string outcomes;
  for (const auto& [op, by] : r.counts.outcomes) {
    std::string inner;
    for (const auto& [outcome, n] : by) inner += fmt::format("{}\"{}\": {}", inner.empty() ? "" : ", ", outcome, n);
    outcomes += fmt::format("{}\"{}\": {{{}}}", outcomes.empty() ? "" : ", ", op, inner);
  }
  std::string problem;
  for (char ch : r.counts.first_problem) {
    if (ch == '"' || ch == '\\') problem += '\\';
    problem += ch;
  }
  fmt::print("{{\"clients\": {}, \"calls_per_client\": {}, \"rpcs\": {}, \"wall_s\": {:.3f}, \"sigterm_sent\": {}, "
             "\"revocation_sent\": {}, "
             "\"outcomes\": {{{}}}, \"verified_sequences\": {}, \"lost\": {}, \"duplicates\": {}, "
             "\"checked_decodes\": {}, \"mismatches\": {}, \"failures\": {}, \"first_problem\": \"{}\"}}\n",
             a.shape.clients, a.shape.calls, r.counts.rpcs, r.wall_s, r.sigterm_sent, r.revocation_sent, outcomes,
             r.counts.verified_sequences, r.counts.lost, r.counts.duplicates, r.counts.checked_decodes,
             r.counts.mismatches, r.failures, problem);
}

// Rewrites the tokens file without the lines whose token (second field) is
// `token`; the server reads it again on SIGHUP. Returns why not, or "".
std::string remove_token(const std::string& path, const std::string& token) {
  std::ifstream in(path);
  if (!in) return fmt::format("--tokens-file: cannot read '{}'", path);
  std::string kept, line;
  int removed = 0;
  while (std::getline(in, line)) {
    std::istringstream fields(line);
    std::string tenant, t;
    fields >> tenant >> t;
    if (!tenant.empty() && tenant[0] != '#' && t == token) {
      ++removed;
      continue;
    }
    kept += line + "\n";
  }
  in.close();
  if (removed == 0) return fmt::format("--revoke-token: expected a token of '{}', found none there", path);
  std::ofstream out(path, std::ios::trunc);
  out << kept;
  if (!out) return fmt::format("--tokens-file: cannot write '{}'", path);
  return "";
}

int run(const SoakArgs& a) {
  auto c = a.server.connect();
  auto config = c->config();
  if (!config.ok()) {
    fmt::print(stderr, "error: {}\n", config.error().to_string());
    return 2;
  }
  if (config->latent()) {
    // Its reference and its appends are written for separate K and V rows.
    fmt::print(stderr,
               "error: server: expected separate K and V heads (v_head_dim = head_dim), received a latent-attention "
               "server (head_dim {}, v_head_dim {}); pagoda-bench kernel and service take --v-head-dim\n",
               config->head_dim, config->v_head_dim);
    return 2;
  }
  if (a.sigterm_after_s > 0 && a.server_pid <= 0) {
    fmt::print(stderr, "error: --sigterm-after: expected --server-pid too, received none\n");
    return 2;
  }
  if (a.revoke_after_s > 0 && (a.server_pid <= 0 || a.revoke_token.empty() || a.tokens_file.empty())) {
    fmt::print(stderr, "error: --revoke-after: expected --server-pid, --revoke-token and --tokens-file too\n");
    return 2;
  }
  if (a.revoke_after_s > 0 && a.sigterm_after_s > 0) {
    fmt::print(stderr, "error: --revoke-after and --sigterm-after: expected one of them, received both\n");
    return 2;
  }
  for (size_t l = 0; l < config->k_scales.size(); ++l) {
    if (config->k_scales[l] != 1.f || config->v_scales[l] != 1.f) {
      fmt::print(stderr, "error: the server's K/V scales: expected 1 in every layer (the checks compare exact "
                         "cache values), received k {} v {} in layer {}\n",
                 config->k_scales[l], config->v_scales[l], l);
      return 2;
    }
  }
  // Each client holds its sequences and a fork, each below max_context (+3 for an append) tokens per layer.
  const int64_t per_seq = (a.shape.max_context + 3 + config->block_size - 1) / config->block_size + 1;
  const int64_t need = static_cast<int64_t>(a.shape.clients) * (a.shape.sequences + 1) * per_seq;
  if (need > config->free_blocks) {
    fmt::print(stderr, "error: the run needs up to {} cache blocks, the server has {} free (lower --clients, "
                       "--sequences or --max-context)\n", need, config->free_blocks);
    return 2;
  }

  std::atomic<bool> skip_verify{false};
  std::atomic<bool> revoked{false};
  client::ConnectionFlags revoked_client = a.server;
  revoked_client.token = a.revoke_token;
  std::vector<SoakCounts> results(static_cast<size_t>(a.shape.clients));
  std::mutex mu;
  std::condition_variable cv;
  int32_t finished = 0;
  const auto t0 = Clock::now();
  std::vector<std::thread> threads;
  for (int32_t i = 0; i < a.shape.clients; ++i) {
    threads.emplace_back([&, i] {
      const bool revokes = a.revoke_after_s > 0 && i == 0;
      results[static_cast<size_t>(i)] = run_soak_client(revokes ? revoked_client : a.server, *config, a.shape, i,
                                                        skip_verify, revokes ? &revoked : nullptr);
      std::lock_guard lock(mu);
      ++finished;
      cv.notify_all();
    });
  }
  SoakReport report;
  if (a.sigterm_after_s > 0) {
    std::unique_lock lock(mu);
    const auto at = t0 + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(a.sigterm_after_s));
    if (!cv.wait_until(lock, at, [&] { return finished == a.shape.clients; })) {
      skip_verify = true;
      report.sigterm_sent = ::kill(static_cast<pid_t>(a.server_pid), SIGTERM) == 0;
      if (!report.sigterm_sent) fmt::print(stderr, "warning: SIGTERM to pid {} failed\n", a.server_pid);
    } else {
      fmt::print(stderr, "note: every client finished before --sigterm-after; no SIGTERM sent\n");
    }
  }
  if (a.revoke_after_s > 0) {
    std::this_thread::sleep_until(
        t0 + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(a.revoke_after_s)));
    const std::string why_not = remove_token(a.tokens_file, a.revoke_token);
    if (!why_not.empty()) {
      fmt::print(stderr, "error: {}\n", why_not);
      revoked = true;  // client 0 then reports, 10 s on, that it was never refused
    } else {
      revoked = true;  // before the signal: the server cannot refuse the token earlier
      report.revocation_sent = ::kill(static_cast<pid_t>(a.server_pid), SIGHUP) == 0;
      if (!report.revocation_sent) fmt::print(stderr, "warning: SIGHUP to pid {} failed\n", a.server_pid);
    }
  }
  for (auto& t : threads) t.join();
  report.wall_s = std::chrono::duration<double>(Clock::now() - t0).count();
  for (const SoakCounts& r : results) report.counts.add(r);
  report.failures = report.counts.failures(report.sigterm_sent);
  if (a.revoke_after_s > 0 && !report.revocation_sent) ++report.failures;
  if (a.json) print_json(a, report);
  else print_table(a, *config, report);
  const bool clean = report.failures == 0 && report.counts.lost == 0 && report.counts.duplicates == 0 &&
                     report.counts.mismatches == 0;
  return clean ? 0 : 1;
}

}  // namespace

void add_soak_command(CLI::App& app, int& exit_code) {
  auto a = std::make_shared<SoakArgs>();
  SoakShape& s = a->shape;
  auto* sub = app.add_subcommand("soak", "Mixed operations from many clients, every outcome counted, every "
                                         "token verified (exit 1 on any loss, duplicate, mismatch or failure)");
  a->server.add_to(*sub);
  sub->add_option("--clients", s.clients, "Concurrent clients (threads, one channel each)")
      ->check(CLI::Range(1, 4096))->capture_default_str();
  sub->add_option("--calls", s.calls, "Operations per client")->check(CLI::PositiveNumber)->capture_default_str();
  sub->add_option("--sequences", s.sequences, "Sequences per client (the batch of its decode steps)")
      ->check(CLI::Range(1, 64))->capture_default_str();
  sub->add_option("--max-context", s.max_context, "Tokens per layer at which a sequence is truncated")
      ->check(CLI::Range(8, 1 << 20))->capture_default_str();
  sub->add_option("--stream-fraction", s.stream_fraction, "Decode steps sent on the client's DecodeStream")
      ->check(CLI::Range(0.0, 1.0))->capture_default_str();
  sub->add_option("--deadline-fraction", s.deadline_fraction,
                  "Decode steps through decode_step with a tiny deadline and retries")
      ->check(CLI::Range(0.0, 1.0))->capture_default_str();
  sub->add_option("--tiny-deadline-us", s.tiny_deadline_us, "The tiny deadline, microseconds")
      ->check(CLI::Range(1, 10000000))->capture_default_str();
  sub->add_option("--append-fraction", s.append_fraction, "Operations that are AppendKV calls")
      ->check(CLI::Range(0.0, 1.0))->capture_default_str();
  sub->add_option("--fork-fraction", s.fork_fraction, "Operations that fork, step the fork (checked) and free it")
      ->check(CLI::Range(0.0, 1.0))->capture_default_str();
  sub->add_option("--free-fraction", s.free_fraction, "Operations that free a sequence and start a new one")
      ->check(CLI::Range(0.0, 1.0))->capture_default_str();
  sub->add_option("--check-every", s.check_every, "Compare one decode step in N against the reference")
      ->check(CLI::PositiveNumber)->capture_default_str();
  sub->add_option("--seed", s.seed, "Seed of the operation mix and the tensors")->capture_default_str();
  sub->add_option("--sigterm-after", a->sigterm_after_s, "Send SIGTERM to --server-pid after this many seconds")
      ->check(CLI::NonNegativeNumber)->capture_default_str();
  sub->add_option("--server-pid", a->server_pid, "The server's process id (with --sigterm-after or --revoke-after)");
  sub->add_option("--revoke-after", a->revoke_after_s,
                  "Take --revoke-token out of --tokens-file and send --server-pid SIGHUP after this many seconds: "
                  "client 0 (which uses that token) must then be refused UNAUTHENTICATED everywhere")
      ->check(CLI::NonNegativeNumber)->capture_default_str();
  sub->add_option("--revoke-token", a->revoke_token, "Client 0's bearer token, the one --revoke-after revokes");
  sub->add_option("--tokens-file", a->tokens_file, "The server's --auth-tokens file (rewritten by --revoke-after)");
  sub->add_flag("--json", a->json, "Print JSON instead of a table");
  sub->callback([a, &exit_code] {
    if (a->shape.append_fraction + a->shape.fork_fraction + a->shape.free_fraction > 1.0) {
      fmt::print(stderr, "error: --append-fraction + --fork-fraction + --free-fraction: expected at most 1, "
                         "received {}\n",
                 a->shape.append_fraction + a->shape.fork_fraction + a->shape.free_fraction);
      exit_code = 2;
      return;
    }
    if (a->shape.deadline_fraction + a->shape.stream_fraction > 1.0) {
      fmt::print(stderr, "error: --deadline-fraction + --stream-fraction: expected at most 1, received {}\n",
                 a->shape.deadline_fraction + a->shape.stream_fraction);
      exit_code = 2;
      return;
    }
    exit_code = run(*a);
  });
}

}  // namespace pagoda::bench
