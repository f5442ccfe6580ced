#include "transfer_bench.h"

#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <mutex>
#include <random>
#include <sstream>
#include <thread>

#include <fmt/format.h>

#include "pagoda/client/client.h"
#include "pagoda/v1/decode_attention.grpc.pb.h"

namespace pagoda::bench {
namespace {

using Clock = std::chrono::steady_clock;

double since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

struct TransferArgs {
  std::string server = "127.0.0.1:50051";
  std::string to = "127.0.0.1:50052";
  std::string sequences = "1,16";
  int32_t tokens = 4096;
  std::string migrate_tokens = "1024,16384";
  int32_t append_every_ms = 10;
};

std::vector<int32_t> parse_list(const std::string& s) {
  std::vector<int32_t> out;
  std::stringstream in(s);
  for (std::string item; std::getline(in, item, ',');) out.push_back(std::stoi(item));
  return out;
}

// Fills a sequence with `tokens` random fp32 tokens in every layer, in pieces.
uint64_t fill(client::Client& c, const client::ServerConfig& cfg, int32_t tokens, std::mt19937& rng) {
  auto id = c.create_sequence("bench");
  if (!id.ok()) throw std::runtime_error(id.error().to_string());
  const int32_t row = cfg.num_kv_heads * cfg.head_dim;
  const int32_t piece = std::max<int32_t>(1, std::min<int64_t>(4096, (cfg.max_message_bytes / 2 - 1024) / (8 * row)));
  std::uniform_real_distribution<float> d(-1.f, 1.f);
  std::vector<float> kv(static_cast<size_t>(piece) * row);
  for (float& x : kv) x = d(rng);
  for (int32_t l = 0; l < cfg.num_layers; ++l) {
    for (int32_t done = 0; done < tokens; done += piece) {
      const int32_t n = std::min(piece, tokens - done);
      const std::span<const float> part(kv.data(), static_cast<size_t>(n) * row);
      auto r = c.append_kv(*id, l, part, part);
      if (!r.ok()) throw std::runtime_error(r.error().to_string());
    }
  }
  return *id;
}

double memcpy_seconds(int64_t bytes) {
  std::vector<char> a(static_cast<size_t>(bytes), 1), b(static_cast<size_t>(bytes));
  double best = 1e30;
  for (int rep = 0; rep < 3; ++rep) {
    const auto t0 = Clock::now();
    std::memcpy(b.data(), a.data(), a.size());
    best = std::min(best, since(t0));
  }
  return best;
}

int run(const TransferArgs& a) {
  auto source = client::Client::connect(a.server);
  auto target = client::Client::connect(a.to);
  auto cfg = source->config();
  if (!cfg.ok()) {
    fmt::print(stderr, "{}\n", cfg.error().to_string());
    return 1;
  }
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(INT32_MAX);
  args.SetMaxSendMessageSize(INT32_MAX);
  auto stub_a = v1::DecodeAttention::NewStub(grpc::CreateCustomChannel(a.server, grpc::InsecureChannelCredentials(), args));
  auto stub_b = v1::DecodeAttention::NewStub(grpc::CreateCustomChannel(a.to, grpc::InsecureChannelCredentials(), args));
  std::mt19937 rng(1);
  fmt::print("transfer: {} layers, {} kv heads x {}, cache {}, {} tokens per layer per sequence\n", cfg->num_layers,
             cfg->num_kv_heads, cfg->head_dim, static_cast<int>(cfg->cache_dtype), a.tokens);
  for (int32_t n : parse_list(a.sequences)) {
    std::vector<uint64_t> ids;
    for (int32_t i = 0; i < n; ++i) ids.push_back(fill(*source, *cfg, a.tokens, rng));
    // Export: every chunk read and kept (the import then replays them).
    std::vector<std::vector<v1::SequenceChunk>> chunks(ids.size());
    int64_t bytes = 0;
    auto t0 = Clock::now();
    for (size_t i = 0; i < ids.size(); ++i) {
      grpc::ClientContext ctx;
      v1::ExportSequenceRequest req;
      req.set_sequence_id(ids[i]);
      auto reader = stub_a->ExportSequence(&ctx, req);
      for (v1::SequenceChunk c; reader->Read(&c);) {
        bytes += static_cast<int64_t>(c.data().size());
        chunks[i].push_back(std::move(c));
      }
      if (!reader->Finish().ok()) return 1;
    }
    const double export_s = since(t0);
    t0 = Clock::now();
    std::vector<uint64_t> imported;
    for (const auto& seq : chunks) {
      grpc::ClientContext ctx;
      v1::ImportSequenceResponse resp;
      auto writer = stub_b->ImportSequence(&ctx, &resp);
      for (const auto& c : seq) writer->Write(c);
      writer->WritesDone();
      const grpc::Status s = writer->Finish();
      if (!s.ok()) {
        fmt::print(stderr, "import: {}\n", s.error_message());
        return 1;
      }
      imported.push_back(resp.sequence_id());
    }
    const double import_s = since(t0);
    const double copy_s = memcpy_seconds(bytes);
    const double mem = bytes / copy_s / 1e9;
    fmt::print("  {:5d} sequences, {:.3f} GB: export {:.2f} GB/s ({:.3f} of memcpy), import {:.2f} GB/s ({:.3f} of "
               "memcpy); memcpy {:.2f} GB/s\n",
               n, bytes / 1e9, bytes / export_s / 1e9, bytes / export_s / 1e9 / mem, bytes / import_s / 1e9,
               bytes / import_s / 1e9 / mem, mem);
    for (uint64_t id : ids) (void)source->free_sequence(id);
    for (uint64_t id : imported) (void)target->free_sequence(id);
  }
  for (int32_t tokens : parse_list(a.migrate_tokens)) {
    const uint64_t id = fill(*source, *cfg, tokens, rng);
    std::mutex steps;
    std::atomic<bool> held{false};
    std::atomic<int64_t> appended{0};
    double worst_gap = 0;
    const int32_t row = cfg->num_kv_heads * cfg->head_dim;
    std::thread appender([&] {
      std::vector<float> kv(static_cast<size_t>(row), 0.5f);
      auto last = Clock::now();
      while (!held.load()) {
        {
          std::lock_guard lock(steps);
          if (held.load()) break;
          for (int32_t l = 0; l < cfg->num_layers; ++l) (void)source->append_kv(id, l, kv, kv);
          ++appended;
          const auto now = Clock::now();
          worst_gap = std::max(worst_gap, std::chrono::duration<double>(now - last).count());
          last = now;
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(a.append_every_ms));
      }
    });
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    client::MigrateOptions options;
    options.last_stage_tokens = 4 * cfg->num_layers;
    std::unique_lock<std::mutex> holding(steps, std::defer_lock);
    options.hold = [&] {
      holding.lock();
      held.store(true);
    };
    const auto t0 = Clock::now();
    auto moved = source->migrate(id, *target, options);
    const double total = since(t0);
    if (holding.owns_lock()) holding.unlock();
    held.store(true);
    appender.join();
    if (!moved.ok()) {
      fmt::print(stderr, "migrate: {}\n", moved.error().to_string());
      return 1;
    }
    fmt::print("  migrate {:6d} tokens/layer with a client appending every {} ms: {} stages, {:.1f} ms in all, "
               "downtime (last stage, hold to source freed) {:.2f} ms; the client's longest gap before it {:.1f} ms\n",
               tokens, a.append_every_ms, moved->stages, total * 1e3, moved->last_stage_seconds * 1e3,
               worst_gap * 1e3);
    (void)target->free_sequence(moved->sequence_id);
  }
  return 0;
}

}  // namespace

void add_transfer_command(CLI::App& app, int& exit_code) {
  auto a = std::make_shared<TransferArgs>();
  auto* sub = app.add_subcommand("transfer", "ExportSequence/ImportSequence GB/s over gRPC (÷ memcpy) between "
                                             "two servers, and a staged migration's downtime under appends");
  sub->add_option("--server", a->server, "Source server host:port")->capture_default_str();
  sub->add_option("--to", a->to, "Target server host:port")->capture_default_str();
  sub->add_option("--sequences", a->sequences, "Comma-separated sequence counts to move")->capture_default_str();
  sub->add_option("--tokens", a->tokens, "Tokens per layer of each sequence")->capture_default_str();
  sub->add_option("--migrate-tokens", a->migrate_tokens, "Comma-separated lengths of the migrated sequence")
      ->capture_default_str();
  sub->add_option("--append-every-ms", a->append_every_ms, "The appending client's period")->capture_default_str();
  sub->callback([a, &exit_code] { exit_code = run(*a); });
}

}  // namespace pagoda::bench
