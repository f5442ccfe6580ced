#include "commands.h"

#include <algorithm>
#include <iostream>
#include <memory>
#include <optional>
#include <utility>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "random_tensors.h"

namespace pagoda::client {
namespace {

// --dtype as fp32/fp16/bf16 (checked), converted when the command runs.
void add_dtype_option(CLI::App* sub, std::string& dtype, const std::string& what) {
  sub->add_option("--dtype", dtype, "Wire dtype of " + what)
      ->check(CLI::IsMember({"fp32", "fp16", "bf16"}))
      ->capture_default_str();
}

DType to_dtype(const std::string& name) { return parse_dtype(name).value_or(DType::kFloat32); }

void print_config(const ServerConfig& c) {
  fmt::print("backend            {} ({})\n", c.backend, c.device_name);
  fmt::print("version            {}\n", c.version);
  fmt::print("layers             {}\n", c.num_layers);
  fmt::print("q_heads / kv_heads {} / {}\n", c.num_q_heads, c.num_kv_heads);
  fmt::print("head_dim           {}\n", c.head_dim);
  fmt::print("v_head_dim         {}{}\n", c.v_head_dim, c.latent() ? " (latent attention: V is K's prefix)" : "");
  fmt::print("block_size         {} tokens\n", c.block_size);
  fmt::print("cache_dtype        {}\n", dtype_name(c.cache_dtype));
  if (!c.k_scales.empty()) fmt::print("k / v scales       {} / {}\n", c.k_scales, c.v_scales);
  fmt::print("blocks             {} free of {}\n", c.free_blocks, c.total_blocks);
  fmt::print("split_tokens       {} ({})\n", c.split_tokens, c.deterministic ? "deterministic" : "fast");
  fmt::print("max_batch          {} sequences, wait {} us\n", c.max_batch, c.max_batch_wait_us);
  fmt::print("max_message_bytes  {}\n", c.max_message_bytes);
}

// K and V for `append`: from files, or `tokens` random rows.
struct AppendArgs {
  uint64_t sequence_id = 0;
  int32_t layer = 0;
  int64_t tokens = 16;
  uint64_t seed = 1;
  std::string k_file;
  std::string v_file;
  std::string dtype = "fp32";
  int32_t expected_length = -1;  // -1: unchecked
};

int run_append(const CliContext& ctx, const AppendArgs& a) {
  auto client = ctx.connect();
  auto config = client->config();
  if (!config.ok()) return report_error(config.error());
  // A latent-attention server takes k alone (V is its rows' prefix).
  std::vector<float> k, v;
  if (!a.k_file.empty()) {
    if (a.v_file.empty() != config->latent()) {
      return report_error(invalid_argument(
          config->latent() ? "--v-file: expected none on a latent-attention server (V is the prefix of K's rows)"
                           : "--v-file: expected V with --k-file, received none"));
    }
    auto kf = read_float_file(a.k_file);
    if (!kf.ok()) return report_error(kf.error());
    k = std::move(*kf);
    if (!config->latent()) {
      auto vf = read_float_file(a.v_file);
      if (!vf.ok()) return report_error(vf.error());
      v = std::move(*vf);
    }
  } else {
    RandomTensors rng(a.seed);
    k = rng.normal(a.tokens * config->kv_row());
    if (!config->latent()) v = rng.normal(a.tokens * config->kv_row());
  }
  const std::optional<int32_t> expected =
      a.expected_length >= 0 ? std::optional<int32_t>(a.expected_length) : std::nullopt;
  auto length = client->append_kv(a.sequence_id, a.layer, k, v, to_dtype(a.dtype), expected);
  if (!length.ok()) return report_error(length.error());
  fmt::print("sequence {} layer {}: {} tokens\n", a.sequence_id, a.layer, *length);
  return 0;
}

struct DecodeCliArgs {
  std::vector<uint64_t> sequence_ids;
  int32_t layer = 0;
  uint64_t seed = 1;
  std::string q_file;
  bool with_kv = false;
  bool lse = false;
  float scale = 0.f;
  std::string dtype = "fp32";
  int show = 8;
  std::vector<int32_t> q_lengths;
  int32_t sliding_window = 0;
  float soft_cap = 0.f;
  std::string sinks_file;
  std::vector<int32_t> expected_lengths;
};

int run_decode(const CliContext& ctx, const DecodeCliArgs& a) {
  auto client = ctx.connect();
  auto config = client->config();
  if (!config.ok()) return report_error(config.error());
  DecodeArgs args{.layer = a.layer, .sequence_ids = a.sequence_ids};
  args.q_lengths = a.q_lengths;
  args.sliding_window = a.sliding_window;
  args.logits_soft_cap = a.soft_cap;
  args.expected_lengths = a.expected_lengths;
  if (!a.sinks_file.empty()) {
    auto sinks = read_float_file(a.sinks_file);
    if (!sinks.ok()) return report_error(sinks.error());
    args.sinks = std::move(*sinks);
  }
  const int64_t rows = args.rows();
  RandomTensors rng(a.seed);
  std::vector<float> q;
  if (!a.q_file.empty()) {
    auto qf = read_float_file(a.q_file);
    if (!qf.ok()) return report_error(qf.error());
    q = std::move(*qf);
  } else {
    q = rng.normal(std::max<int64_t>(rows, 0) * config->q_row());
  }
  std::vector<float> k, v;
  if (a.with_kv) {
    k = rng.normal(std::max<int64_t>(rows, 0) * config->kv_row());
    if (!config->latent()) v = rng.normal(std::max<int64_t>(rows, 0) * config->kv_row());  // else V is k's prefix
  }
  const DType dtype = to_dtype(a.dtype);
  args.q = q;
  args.k = k;
  args.v = v;
  args.q_dtype = args.kv_dtype = dtype;
  args.scale = a.scale;
  args.return_lse = a.lse;
  auto r = client->decode(args);
  if (!r.ok()) return report_error(r.error());
  fmt::print("lengths {}  splits {}  split_tokens {}  {}\n", r->lengths, r->splits, r->split_tokens,
             r->deterministic ? "deterministic" : "fast");
  fmt::print("timing  queue {:.1f} us  compute {:.1f} us  total {:.1f} us\n", r->timing.queue_us,
             r->timing.compute_us, r->timing.total_us);
  // One line per query row: "seq 7 row 2" is the third of sequence 7's rows.
  int64_t out_row = 0;
  for (size_t b = 0; b < a.sequence_ids.size(); ++b) {
    const int32_t n_rows = a.q_lengths.empty() ? 1 : a.q_lengths[b];
    for (int32_t i = 0; i < n_rows; ++i, ++out_row) {
      const std::string who = a.q_lengths.empty() ? fmt::format("seq {}", a.sequence_ids[b])
                                                  : fmt::format("seq {} row {}", a.sequence_ids[b], i);
      const auto row = r->output.begin() + out_row * config->out_row();
      const auto n = std::min<int64_t>(a.show, config->out_row());
      fmt::print("{} output[0, :{}] = [{:.5f}]\n", who, n, fmt::join(row, row + n, ", "));
      if (!r->lse.empty()) {
        const auto l = r->lse.begin() + out_row * config->num_q_heads;
        fmt::print("{} lse = [{:.5f}]\n", who, fmt::join(l, l + config->num_q_heads, ", "));
      }
    }
  }
  return 0;
}

}  // namespace

void add_rpc_commands(CLI::App& app, CliContext& ctx) {
  app.add_subcommand("config", "Print the server's geometry, capacity and settings (GetConfig)")
      ->callback([&ctx] {
        auto config = ctx.connect()->config();
        ctx.exit_code = config.ok() ? (print_config(*config), 0) : report_error(config.error());
      });

  auto label = std::make_shared<std::string>();
  auto* create = app.add_subcommand("create", "Create an empty sequence; prints its id");
  create->add_option("--label", *label, "Free text kept with the sequence");
  create->callback([&ctx, label] {
    auto id = ctx.connect()->create_sequence(*label);
    ctx.exit_code = id.ok() ? (fmt::print("{}\n", *id), 0) : report_error(id.error());
  });

  auto append = std::make_shared<AppendArgs>();
  auto* app_cmd = app.add_subcommand("append", "Append K/V tokens to one layer of a sequence");
  app_cmd->add_option("--seq", append->sequence_id, "Sequence id")->required();
  app_cmd->add_option("--layer", append->layer, "Layer")->capture_default_str();
  auto* tokens = app_cmd->add_option("--tokens", append->tokens, "Random tokens to append")
                     ->check(CLI::PositiveNumber)->capture_default_str();
  app_cmd->add_option("--seed", append->seed, "Seed of the random K/V")->capture_default_str();
  auto* kf = app_cmd->add_option("--k-file", append->k_file,
                                 "K as raw little-endian fp32 [n, kv_heads, head_dim]")
                 ->check(CLI::ExistingFile);
  auto* vf = app_cmd->add_option("--v-file", append->v_file,
                                 "V, same shape as K (none on a latent-attention server: V is K's prefix)")
                 ->check(CLI::ExistingFile);
  vf->needs(kf);
  kf->excludes(tokens);
  add_dtype_option(app_cmd, append->dtype, "K and V");
  app_cmd->add_option("--expected-length", append->expected_length,
                      "Refuse (FAILED_PRECONDITION) unless the layer holds exactly this many tokens first")
      ->check(CLI::NonNegativeNumber);
  app_cmd->callback([&ctx, append] { ctx.exit_code = run_append(ctx, *append); });

  auto decode = std::make_shared<DecodeCliArgs>();
  auto* dec = app.add_subcommand("decode", "One decode step of one layer for a batch of sequences");
  dec->add_option("--seq", decode->sequence_ids, "Sequence ids (repeat or comma-separate)")
      ->required()->delimiter(',');
  dec->add_option("--layer", decode->layer, "Layer")->capture_default_str();
  dec->add_option("--seed", decode->seed, "Seed of the random q (and k/v)")->capture_default_str();
  dec->add_option("--q-file", decode->q_file, "q as raw little-endian fp32 [rows, q_heads, head_dim] (rows: sum of --q-lengths, else one per sequence)")
      ->check(CLI::ExistingFile);
  dec->add_flag("--with-kv", decode->with_kv,
                "Append a random new token's K/V before attending (k alone on a latent-attention server)");
  dec->add_flag("--lse", decode->lse, "Also return the log-sum-exp");
  dec->add_option("--scale", decode->scale,
                  "Softmax scale (0 = 1/sqrt(head_dim); a latent-attention server needs the model's own)")
      ->capture_default_str();
  dec->add_option("--show", decode->show, "Output values to print per sequence")->capture_default_str();
  add_dtype_option(dec, decode->dtype, "q, k, v and the output");
  dec->add_option("--q-lengths", decode->q_lengths,
                  "Query rows per sequence (speculative drafts, chunked prefill): the last rows of each")
      ->delimiter(',');
  dec->add_option("--window", decode->sliding_window, "Sliding window W: keys (p - W, p] (0 = none)")
      ->check(CLI::NonNegativeNumber)->capture_default_str();
  dec->add_option("--soft-cap", decode->soft_cap, "Logit soft-cap c: c * tanh(score / c) (0 = none)")
      ->check(CLI::NonNegativeNumber)->capture_default_str();
  dec->add_option("--sinks-file", decode->sinks_file,
                  "Per-head sink logits as raw little-endian fp32 [q_heads], natural log")
      ->check(CLI::ExistingFile);
  dec->add_option("--expected-lengths", decode->expected_lengths,
                  "Length each sequence must have before the append (a safe retry)")
      ->delimiter(',');
  dec->callback([&ctx, decode] { ctx.exit_code = run_decode(ctx, *decode); });

  auto fork_source = std::make_shared<uint64_t>(0);
  auto fork_count = std::make_shared<int32_t>(1);
  auto* fork = app.add_subcommand("fork", "Fork a sequence (copy-on-write); prints the new ids, one per line");
  fork->add_option("--seq", *fork_source, "Source sequence id")->required();
  fork->add_option("--count", *fork_count, "Forks to make in one call, all or none")->capture_default_str();
  fork->callback([&ctx, fork_source, fork_count] {
    auto ids = ctx.connect()->fork_sequences(*fork_source, *fork_count);
    if (!ids.ok()) {
      ctx.exit_code = report_error(ids.error());
      return;
    }
    for (uint64_t id : *ids) fmt::print("{}\n", id);
    ctx.exit_code = 0;
  });

  auto free_id = std::make_shared<uint64_t>(0);
  auto* free_cmd = app.add_subcommand("free", "Free a sequence");
  free_cmd->add_option("--seq", *free_id, "Sequence id")->required();
  free_cmd->callback([&ctx, free_id] {
    auto done = ctx.connect()->free_sequence(*free_id);
    ctx.exit_code = done.ok() ? 0 : report_error(done.error());
  });

  // Shared-memory regions (a server with --allow-shared-memory).
  struct ShmArgs {
    std::string name, key;
    int64_t offset = 0, bytes = 0;
  };
  auto shm = std::make_shared<ShmArgs>();
  auto* shm_cmd = app.add_subcommand("shm", "Shared-memory regions of this caller: status, register, unregister");
  shm_cmd->require_subcommand(1);
  auto* shm_status = shm_cmd->add_subcommand("status", "List the caller's regions (name, key, offset, bytes)");
  shm_status->add_option("--name", shm->name, "One region (default: all)");
  shm_status->callback([&ctx, shm] {
    auto regions = ctx.connect()->shared_memory_status(shm->name);
    if (!regions.ok()) {
      ctx.exit_code = report_error(regions.error());
      return;
    }
    for (const auto& r : *regions) fmt::print("{} {} offset {} bytes {}\n", r.name, r.key, r.offset, r.byte_size);
    ctx.exit_code = 0;
  });
  auto* shm_register = shm_cmd->add_subcommand("register", "Register a range of a POSIX shared-memory object");
  shm_register->add_option("--name", shm->name, "Name the calls will use")->required();
  shm_register->add_option("--key", shm->key, "The object, e.g. /orchestrator-0")->required();
  shm_register->add_option("--offset", shm->offset, "Where the region starts in the object, bytes");
  shm_register->add_option("--bytes", shm->bytes, "The region's size, bytes")->required();
  shm_register->callback([&ctx, shm] {
    auto done = ctx.connect()->register_shared_memory(shm->name, shm->key, shm->offset, shm->bytes);
    ctx.exit_code = done.ok() ? 0 : report_error(done.error());
  });
  auto* shm_unregister = shm_cmd->add_subcommand("unregister", "Unregister one region, or all of the caller's");
  shm_unregister->add_option("--name", shm->name, "One region (default: all)");
  shm_unregister->callback([&ctx, shm] {
    auto done = ctx.connect()->unregister_shared_memory(shm->name);
    ctx.exit_code = done.ok() ? 0 : report_error(done.error());
  });

  auto truncate = std::make_shared<std::pair<uint64_t, int32_t>>(0, 0);
  auto* trunc = app.add_subcommand("truncate", "Cut every layer of a sequence to a length (rejected drafts)");
  trunc->add_option("--seq", truncate->first, "Sequence id")->required();
  trunc->add_option("--length", truncate->second, "Tokens to keep")->required()->check(CLI::NonNegativeNumber);
  trunc->callback([&ctx, truncate] {
    auto lengths = ctx.connect()->truncate_sequence(truncate->first, truncate->second);
    ctx.exit_code = lengths.ok() ? (fmt::print("sequence {}: layer lengths {}\n", truncate->first, *lengths), 0)
                                 : report_error(lengths.error());
  });

  struct MigrateArgs {
    uint64_t seq = 0;
    std::string to;
    bool keep_source = false;
  };
  auto migrate_args = std::make_shared<MigrateArgs>();
  auto* migrate = app.add_subcommand(
      "migrate", "Move a sequence to another server (export, import in stages, free the source); prints its new id");
  migrate->add_option("--seq", migrate_args->seq, "Sequence id on --server")->required();
  migrate->add_option("--to", migrate_args->to, "Target server host:port (same --token and TLS flags)")->required();
  migrate->add_flag("--keep-source", migrate_args->keep_source, "Leave the source sequence in place (a copy)");
  migrate->callback([&ctx, migrate_args] {
    ClientOptions base;
    base.timeout = std::chrono::milliseconds(ctx.timeout_ms);
    std::unique_ptr<Client> source = ctx.connect();
    std::unique_ptr<Client> target = Client::connect(migrate_args->to, ctx.connection.options(base));
    MigrateOptions options;
    options.free_source = !migrate_args->keep_source;
    auto moved = source->migrate(migrate_args->seq, *target, options);
    if (!moved.ok()) {
      ctx.exit_code = report_error(moved.error());
      return;
    }
    fmt::print("{}\n", moved->sequence_id);
    fmt::print(stderr, "sequence {} on {} -> {} on {}: layer lengths {}, {} bytes in {} stages{}\n",
               migrate_args->seq, source->address(), moved->sequence_id, migrate_args->to, moved->layer_lengths,
               moved->bytes, moved->stages, migrate_args->keep_source ? " (source kept)" : ", source freed");
  });

  auto inspect_id = std::make_shared<uint64_t>(0);
  auto* inspect = app.add_subcommand("inspect", "Per-layer lengths and blocks of a sequence (GetSequence)");
  inspect->add_option("--seq", *inspect_id, "Sequence id")->required();
  inspect->callback([&ctx, inspect_id] {
    auto info = ctx.connect()->get_sequence(*inspect_id);
    if (!info.ok()) {
      ctx.exit_code = report_error(info.error());
      return;
    }
    fmt::print("sequence {} '{}': {} blocks, layer lengths {}\n", info->sequence_id, info->label,
               info->blocks_held, info->layer_lengths);
  });

  auto service = std::make_shared<std::string>();
  auto* health = app.add_subcommand(
      "health", "grpc.health.v1 Check; exit 0 when SERVING, 1 otherwise (container HEALTHCHECK)");
  health->add_option("--service", *service, "Service name (empty = the whole server)");
  health->callback([&ctx, service] {
    auto status = ctx.connect()->health(*service);
    if (!status.ok()) {
      ctx.exit_code = report_error(status.error());
      return;
    }
    fmt::print("{}\n", serving_status_name(*status));
    ctx.exit_code = *status == ServingStatus::kServing ? 0 : 1;
  });
}

}  // namespace pagoda::client
