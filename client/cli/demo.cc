#include "demo.h"

#include <cmath>
#include <map>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "pagoda/client/tensor.h"
#include "random_tensors.h"
#include "reference.h"

namespace pagoda::client {
namespace {

struct DemoArgs {
  int64_t tokens = 300;     // per layer (layer l gets tokens + 7 * l, so layers differ)
  int64_t append_chunk = 128;
  uint64_t seed = 42;
  double atol = 1e-4;       // outputs are fp32 sums over K/V as the server stores them
  bool keep = false;        // leave the sequences on the server
};

// The K/V of one sequence as the server holds them (rounded to the cache dtype),
// per layer: [n, num_kv_heads, head_dim] each.
struct LocalSequence {
  uint64_t id = 0;
  std::vector<std::vector<float>> k, v;  // [num_layers][n * kv_row]
};

// Runs the checks, prints one line per check, and remembers whether all passed.
class Demo {
 public:
  Demo(Client& client, const ServerConfig& config, const DemoArgs& args)
      : client_(client), config_(config), args_(args), rng_(args.seed),
        layout_{config.num_q_heads, config.num_kv_heads, config.head_dim} {}

  int run();

 private:
  bool fail(const Error& e) {
    fmt::print("FAIL  {}\n", e.to_string());
    passed_ = false;
    return false;
  }
  void check(const std::string& what, bool ok, const std::string& detail) {
    fmt::print("{}  {:<46} {}\n", ok ? "ok  " : "FAIL", what, detail);
    passed_ = passed_ && ok;
  }
  bool create(LocalSequence& s, const std::string& label);
  bool append(LocalSequence& s, int32_t layer, int64_t n);
  // Decodes the sequences at `layer` (appending one new random token to each
  // when with_kv) and checks every output and LSE against the reference.
  bool decode_and_check(const std::string& what, std::vector<LocalSequence*> seqs, int32_t layer,
                        bool with_kv, DType q_dtype, std::vector<float>* output = nullptr);
  // Sends a Decode with k/v that the server must reject with `want`, and checks
  // that `s` kept every layer's length (a failed call changes nothing).
  void check_rejected(const std::string& what, const LocalSequence& s, int32_t layer,
                      std::vector<uint64_t> ids, ErrorCode want);

  Client& client_;
  ServerConfig config_;
  DemoArgs args_;
  RandomTensors rng_;
  HeadLayout layout_;
  bool passed_ = true;
  double max_output_error_ = 0;
  double max_lse_error_ = 0;
};

bool Demo::create(LocalSequence& s, const std::string& label) {
  auto id = client_.create_sequence(label);
  if (!id.ok()) return fail(id.error());
  s.id = *id;
  s.k.assign(config_.num_layers, {});
  s.v.assign(config_.num_layers, {});
  return true;
}

bool Demo::append(LocalSequence& s, int32_t layer, int64_t n) {
  // In chunks, so that a large context stays under the server's message limit.
  for (int64_t done = 0; done < n; done += args_.append_chunk) {
    const int64_t rows = std::min(args_.append_chunk, n - done);
    const auto k = rng_.normal(rows * config_.kv_row());
    const auto v = rng_.normal(rows * config_.kv_row());
    auto length = client_.append_kv(s.id, layer, k, v, DType::kFloat32);
    if (!length.ok()) return fail(length.error());
    const auto kr = round_to_dtype(k, config_.cache_dtype);
    const auto vr = round_to_dtype(v, config_.cache_dtype);
    s.k[layer].insert(s.k[layer].end(), kr.begin(), kr.end());
    s.v[layer].insert(s.v[layer].end(), vr.begin(), vr.end());
  }
  return true;
}

bool Demo::decode_and_check(const std::string& what, std::vector<LocalSequence*> seqs, int32_t layer,
                            bool with_kv, DType q_dtype, std::vector<float>* output) {
  const auto batch = static_cast<int64_t>(seqs.size());
  // q as the server sees it: rounded to its wire dtype.
  const auto q = round_to_dtype(rng_.normal(batch * config_.q_row()), q_dtype);
  std::vector<float> k, v;
  if (with_kv) {
    k = rng_.normal(batch * config_.kv_row());
    v = rng_.normal(batch * config_.kv_row());
  }
  std::vector<uint64_t> ids;
  for (LocalSequence* s : seqs) ids.push_back(s->id);
  DecodeArgs args{.layer = layer, .sequence_ids = ids, .q = q, .k = k, .v = v, .q_dtype = q_dtype,
                  .kv_dtype = DType::kFloat32, .return_lse = true};
  auto r = client_.decode(args);
  if (!r.ok()) return fail(r.error());
  if (output) *output = r->output;

  // An output in fp16/bf16 carries that type's rounding on top of the fp32 result.
  const double rtol = q_dtype == DType::kFloat32 ? 0.0
                      : q_dtype == DType::kFloat16 ? std::ldexp(1.0, -11) : std::ldexp(1.0, -8);
  bool ok = true;
  double out_err = 0, lse_err = 0;
  std::string lengths;
  for (int64_t b = 0; b < batch; ++b) {
    LocalSequence& s = *seqs[b];
    if (with_kv) {
      const auto row = config_.kv_row();
      const auto kr = round_to_dtype(std::span(k).subspan(b * row, row), config_.cache_dtype);
      const auto vr = round_to_dtype(std::span(v).subspan(b * row, row), config_.cache_dtype);
      s.k[layer].insert(s.k[layer].end(), kr.begin(), kr.end());
      s.v[layer].insert(s.v[layer].end(), vr.begin(), vr.end());
    }
    const int64_t want_len = static_cast<int64_t>(s.k[layer].size()) / config_.kv_row();
    const int64_t got_len = b < static_cast<int64_t>(r->lengths.size()) ? r->lengths[b] : -1;
    ok = ok && got_len == want_len;
    lengths += fmt::format("{}{}", b ? "," : "", got_len);
    const ReferenceRow ref = reference_decode(
        layout_, std::span(q).subspan(b * config_.q_row(), config_.q_row()), s.k[layer], s.v[layer], 0.0);
    const Comparison co = compare(
        ref.out, std::span(r->output).subspan(b * config_.q_row(), config_.q_row()), args_.atol, rtol);
    const Comparison cl = r->lse.empty() ? Comparison{INFINITY, false}
                                         : compare(ref.lse, std::span(r->lse).subspan(
                                                                b * config_.num_q_heads, config_.num_q_heads),
                                                   args_.atol, 0.0);
    ok = ok && co.pass && cl.pass;
    out_err = std::max(out_err, co.max_abs_error);
    lse_err = std::max(lse_err, cl.max_abs_error);
  }
  max_output_error_ = std::max(max_output_error_, out_err);
  max_lse_error_ = std::max(max_lse_error_, lse_err);
  check(what, ok, fmt::format("len {:<9} max err out {:.2e} lse {:.2e}", lengths, out_err, lse_err));
  return ok;
}

void Demo::check_rejected(const std::string& what, const LocalSequence& s, int32_t layer,
                          std::vector<uint64_t> ids, ErrorCode want) {
  const auto batch = static_cast<int64_t>(ids.size());
  const auto q = rng_.normal(batch * config_.q_row());
  const auto k = rng_.normal(batch * config_.kv_row());
  const auto v = rng_.normal(batch * config_.kv_row());
  auto before = client_.get_sequence(s.id);
  auto r = client_.decode({.layer = layer, .sequence_ids = ids, .q = q, .k = k, .v = v});
  auto after = client_.get_sequence(s.id);
  if (!before.ok() || !after.ok()) {
    fail(before.ok() ? after.error() : before.error());
    return;
  }
  const bool unchanged = before->layer_lengths == after->layer_lengths;
  check(what, !r.ok() && r.error().code() == want && unchanged,
        fmt::format("{}, lengths {}", r.ok() ? "accepted" : r.error().code_name(),
                    unchanged ? "unchanged" : "CHANGED"));
}

int Demo::run() {
  fmt::print("server {}: {} backend, {} layers, {} q / {} kv heads, head_dim {}, cache {}, block {}\n",
             client_.address(), config_.backend, config_.num_layers, config_.num_q_heads,
             config_.num_kv_heads, config_.head_dim, dtype_name(config_.cache_dtype), config_.block_size);
  LocalSequence a, b;
  if (!create(a, "demo-a") || !create(b, "demo-b")) return 1;

  // Layers are appended independently and get different lengths.
  for (int32_t layer = 0; layer < config_.num_layers; ++layer)
    if (!append(a, layer, args_.tokens + 7 * layer)) return 1;
  if (!append(b, 0, 37)) return 1;
  auto info = client_.get_sequence(a.id);
  if (!info.ok()) {
    fail(info.error());
    return 1;
  }
  bool lengths_ok = static_cast<int32_t>(info->layer_lengths.size()) == config_.num_layers;
  for (int32_t l = 0; lengths_ok && l < config_.num_layers; ++l)
    lengths_ok = info->layer_lengths[l] == args_.tokens + 7 * l;
  check("GetSequence: per-layer lengths", lengths_ok,
        fmt::format("{} blocks held", info->blocks_held));

  for (int32_t layer = 0; layer < config_.num_layers; ++layer)
    decode_and_check(fmt::format("decode layer {}", layer), {&a}, layer, false, DType::kFloat32);
  decode_and_check("decode layer 0 with appended k/v", {&a}, 0, true, DType::kFloat32);
  decode_and_check("decode batch of 2 (different lengths) + k/v", {&a, &b}, 0, true, DType::kFloat32);
  decode_and_check("decode with fp16 q and output", {&a}, 0, false, DType::kFloat16);
  check_rejected("reject: unknown layer", a, config_.num_layers, {a.id}, ErrorCode::kInvalidArgument);
  // All or nothing: the known sequence of the batch must not get its token either.
  check_rejected("reject: unknown sequence in a batch", a, 0, {a.id, ~uint64_t{0}}, ErrorCode::kNotFound);

  // Fork shares A's blocks; appending to the fork writes into a shared, partly
  // filled last block, which must be copied first: A must not see it.
  LocalSequence c = a;
  auto forked = client_.fork_sequence(a.id);
  if (!forked.ok()) {
    fail(forked.error());
    return 1;
  }
  c.id = *forked;
  const int64_t len0 = static_cast<int64_t>(a.k[0].size()) / config_.kv_row();
  fmt::print("      fork {} -> {} at layer-0 length {} ({} in its last block)\n", a.id, c.id, len0,
             len0 % config_.block_size);
  decode_and_check("fork: decode the fork with appended k/v", {&c}, 0, true, DType::kFloat32);
  decode_and_check("fork: source unchanged (copy-on-write)", {&a}, 0, false, DType::kFloat32);
  decode_and_check("fork: both in one batch", {&a, &c}, 0, false, DType::kFloat32);

  if (!args_.keep) {
    for (const LocalSequence* s : {&c, &b, &a}) {
      auto done = client_.free_sequence(s->id);
      if (!done.ok()) fail(done.error());
    }
    auto gone = client_.get_sequence(a.id);
    check("free: freed sequence is NOT_FOUND", !gone.ok() && gone.error().code() == ErrorCode::kNotFound,
          gone.ok() ? "still there" : gone.error().code_name());
  }

  fmt::print("max error: output {:.3e}, lse {:.3e} (atol {:.1e})\n", max_output_error_, max_lse_error_,
             args_.atol);
  fmt::print("{}\n", passed_ ? "PASS" : "FAIL");
  return passed_ ? 0 : 1;
}

}  // namespace

void add_demo_command(CLI::App& app, CliContext& ctx) {
  auto args = std::make_shared<DemoArgs>();
  auto* demo = app.add_subcommand(
      "demo", "Run a short session and check every output against a local double-precision reference");
  demo->add_option("--tokens", args->tokens, "Tokens appended per layer (layer l gets tokens + 7l)")
      ->check(CLI::PositiveNumber)->capture_default_str();
  demo->add_option("--append-chunk", args->append_chunk, "Tokens per AppendKV call")
      ->check(CLI::PositiveNumber)->capture_default_str();
  demo->add_option("--seed", args->seed, "Seed of every random tensor")->capture_default_str();
  demo->add_option("--atol", args->atol, "Absolute tolerance on outputs and LSE")->capture_default_str();
  demo->add_flag("--keep", args->keep, "Leave the demo's sequences on the server");
  demo->callback([&ctx, args] {
    auto client = ctx.connect();
    auto config = client->config();
    if (!config.ok()) {
      ctx.exit_code = report_error(config.error());
      fmt::print("FAIL\n");
      return;
    }
    Demo demo_run(*client, *config, *args);
    ctx.exit_code = demo_run.run();
  });
}

}  // namespace pagoda::client
