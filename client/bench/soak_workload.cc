#include "soak_workload.h"

#include <algorithm>
#include <chrono>
#include <memory>
#include <optional>
#include <random>
#include <span>
#include <vector>

#include <fmt/format.h>

#include "reference.h"

namespace pagoda::bench {
namespace {

using client::ErrorCode;

uint64_t splitmix(uint64_t& state) {
  uint64_t z = (state += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

// Multiples of 1/8 in [-1, 1]: exact in every cache dtype, fp8 included (at
// unit scale), so the reference sees what the cache holds.
float eighth(uint64_t bits) { return static_cast<float>(static_cast<int>(bits % 17) - 8) / 8.f; }

// The K and V rows of the token with this key.
void token_kv(uint64_t key, int64_t kv_row, float* k, float* v) {
  uint64_t state = key;
  for (int64_t i = 0; i < kv_row; ++i) {
    const uint64_t bits = splitmix(state);
    k[i] = eighth(bits);
    v[i] = eighth(bits >> 32);
  }
}

struct KnownSequence {
  uint64_t id = 0;
  std::vector<std::vector<uint64_t>> layers;  // [layer][position] the keys of its tokens
};

constexpr const char* kUnary = "decode_unary";
constexpr const char* kStream = "decode_stream";
constexpr const char* kTiny = "decode_step_tiny_deadline";

class SoakClient {
 public:
  SoakClient(const client::ConnectionFlags& server, const client::ServerConfig& config, const SoakShape& shape,
             int32_t index, const std::atomic<bool>& skip_verify, const std::atomic<bool>* revoked)
      : config_(config), shape_(shape), index_(index), skip_verify_(skip_verify), revoked_(revoked),
        rng_(shape.seed * 1000003u + static_cast<uint64_t>(index)),
        layout_{config.num_q_heads, config.num_kv_heads, config.head_dim} {
    client_ = server.connect();
    client::ClientOptions tiny;
    tiny.timeout = std::chrono::microseconds(shape.tiny_deadline_us);
    tiny_ = server.connect(tiny);
  }

  SoakCounts run() {
    for (int32_t i = 0; i < shape_.sequences && live_; ++i) {
      KnownSequence s;
      if (create(s)) seqs_.push_back(std::move(s));
    }
    // The revoked client goes on until its revocation has been seen (at most
    // 10 s after the token was taken out).
    std::optional<std::chrono::steady_clock::time_point> revoked_at;
    for (int64_t n = 0; live_; ++n) {
      if (n >= shape_.calls && revoked_ == nullptr) break;
      if (revoked_ != nullptr && n >= shape_.calls && revoked_->load()) {
        if (!revoked_at) revoked_at = std::chrono::steady_clock::now();
        if (std::chrono::steady_clock::now() - *revoked_at > std::chrono::seconds(10)) {
          ++counts_.outcomes["revoked"]["never_refused"];
          problem("the revoked token was still served 10 s after the revocation");
          break;
        }
      }
      if (!keep_bounded()) break;
      operation();
    }
    if (refused_after_revocation_) {
      probe_after_revocation();
      counts_.unverified_revoked += static_cast<int64_t>(seqs_.size());
      return std::move(counts_);
    }
    if (stream_ && live_) {
      auto fin = stream_->finish();
      ++counts_.rpcs;
      if (!fin.ok()) failed("stream_finish", fin.error());
    }
    if (live_ && !skip_verify_.load()) verify();
    return std::move(counts_);
  }

 private:
  void operation() {
    std::uniform_real_distribution<double> u(0, 1);
    const double r = u(rng_);
    double edge = shape_.append_fraction;
    if (r < edge) return append_op();
    if (r < (edge += shape_.fork_fraction)) return fork_op();
    if (r < (edge += shape_.free_fraction)) return free_op();
    std::vector<KnownSequence*> batch;
    for (KnownSequence& s : seqs_) batch.push_back(&s);
    const double how = u(rng_);
    const char* op = how < shape_.deadline_fraction                         ? kTiny
                     : how < shape_.deadline_fraction + shape_.stream_fraction ? kStream
                                                                              : kUnary;
    step(op, batch, random_layer(), false);
  }

  // One decode step appending a token to each sequence of `batch` on `layer`,
  // with expected lengths; checks the lengths answered, and the output against
  // the reference on every check_every-th step (or `check`).
  void step(const char* op, const std::vector<KnownSequence*>& batch, int32_t layer, bool check) {
    const int64_t rows = static_cast<int64_t>(batch.size());
    std::vector<float> q = random_q(rows), k(static_cast<size_t>(rows * config_.kv_row())), v(k.size());
    std::vector<uint64_t> keys;
    client::DecodeArgs args{.layer = layer, .q = q, .k = k, .v = v};
    for (int64_t i = 0; i < rows; ++i) {
      keys.push_back(next_key());
      token_kv(keys.back(), config_.kv_row(), k.data() + i * config_.kv_row(), v.data() + i * config_.kv_row());
      args.sequence_ids.push_back(batch[static_cast<size_t>(i)]->id);
      args.expected_lengths.push_back(length(*batch[static_cast<size_t>(i)], layer));
    }
    auto r = send(op, args);
    if (!r) return;
    for (int64_t i = 0; i < rows; ++i) {
      KnownSequence& s = *batch[static_cast<size_t>(i)];
      if (!lengths_agree(op, r->lengths[static_cast<size_t>(i)], length(s, layer) + 1)) return;
      s.layers[static_cast<size_t>(layer)].push_back(keys[static_cast<size_t>(i)]);
    }
    if (check || ++decodes_ % shape_.check_every == 0) {
      for (int64_t i = 0; i < rows; ++i) {
        check_output(*batch[static_cast<size_t>(i)], layer, std::span(q).subspan(i * config_.q_row(), config_.q_row()),
                     std::span<const float>(r->output).subspan(i * config_.q_row(), config_.q_row()));
      }
    }
  }

  // Sends a decode the way `op` says; records the outcome. Empty on failure.
  std::optional<client::DecodeResult> send(const char* op, const client::DecodeArgs& args) {
    if (op == kUnary) {
      ++counts_.rpcs;
      auto r = client_->decode(args);
      if (!r.ok()) return failed(op, r.error()), std::nullopt;
      return answered(op, std::move(*r), "ok");
    }
    if (op == kStream) {
      if (!stream_) {
        auto s = client_->open_stream();
        if (!s.ok()) return failed(op, s.error()), std::nullopt;
        stream_ = std::move(*s);
      }
      ++counts_.rpcs;
      auto r = stream_->call(args);
      if (!r.ok()) return failed(op, r.error()), std::nullopt;
      return answered(op, std::move(*r), "ok");
    }
    const client::RetryOptions retry{.attempts = 4, .backoff = std::chrono::milliseconds(1)};
    auto r = tiny_->decode_step(args, retry);
    if (r.ok()) {
      counts_.rpcs += r->attempts;
      const char* outcome = r->replayed ? "replayed" : r->attempts > 1 ? "retried" : "ok";
      return answered(op, std::move(*r), outcome);
    }
    counts_.rpcs += retry.attempts;  // at most; the client does not say how many a failure took
    if (r.error().code() != ErrorCode::kDeadlineExceeded) return failed(op, r.error()), std::nullopt;
    // Every attempt carried the expected lengths, so at most one of them, or
    // this call, appends: finishing without a deadline leaves the step applied
    // exactly once, whichever did.
    auto done = client_->decode_step(args);
    if (!done.ok()) return failed(op, done.error()), std::nullopt;
    counts_.rpcs += done->attempts;
    return answered(op, std::move(*done), "gave_up");
  }

  client::DecodeResult answered(const char* op, client::DecodeResult r, const char* outcome) {
    ++counts_.outcomes[op][outcome];
    return r;
  }

  void append_op() {
    KnownSequence& s = seqs_[pick(seqs_.size())];
    const int32_t layer = random_layer();
    const int32_t n = static_cast<int32_t>(1 + pick(3));
    std::vector<float> k(static_cast<size_t>(n * config_.kv_row())), v(k.size());
    std::vector<uint64_t> keys;
    for (int32_t i = 0; i < n; ++i) {
      keys.push_back(next_key());
      token_kv(keys.back(), config_.kv_row(), k.data() + i * config_.kv_row(), v.data() + i * config_.kv_row());
    }
    ++counts_.rpcs;
    auto r = client_->append_kv(s.id, layer, k, v, DType::kFloat32, length(s, layer));
    if (!r.ok()) return failed("append_kv", r.error());
    ++counts_.outcomes["append_kv"]["ok"];
    if (!lengths_agree("append_kv", *r, length(s, layer) + n)) return;
    auto& tokens = s.layers[static_cast<size_t>(layer)];
    tokens.insert(tokens.end(), keys.begin(), keys.end());
  }

  // Fork the first sequence, decode one step on the fork (always checked,
  // with its copy-on-write of a shared partly filled block), free the fork.
  void fork_op() {
    ++counts_.rpcs;
    auto f = client_->fork_sequence(seqs_.front().id);
    if (!f.ok()) return failed("fork", f.error());
    ++counts_.outcomes["fork"]["ok"];
    KnownSequence fork = seqs_.front();
    fork.id = *f;
    step(kUnary, {&fork}, random_layer(), true);
    if (!live_) return;
    release(fork);
  }

  void free_op() {
    const size_t i = pick(seqs_.size());
    if (!release(seqs_[i])) return;
    KnownSequence fresh;
    if (create(fresh)) seqs_[i] = std::move(fresh);
  }

  bool create(KnownSequence& s) {
    ++counts_.rpcs;
    auto id = client_->create_sequence(fmt::format("soak-{}", index_));
    if (!id.ok()) return failed("create", id.error()), false;
    ++counts_.outcomes["create"]["ok"];
    s.id = *id;
    s.layers.assign(static_cast<size_t>(config_.num_layers), {});
    return true;
  }

  bool release(const KnownSequence& s) {
    ++counts_.rpcs;
    auto r = client_->free_sequence(s.id);
    if (!r.ok()) return failed("free", r.error()), false;
    ++counts_.outcomes["free"]["ok"];
    return true;
  }

  // Truncates every sequence that reached max_context in a layer (rejected
  // drafts, as a speculative decoder would); false once the client stops.
  bool keep_bounded() {
    for (KnownSequence& s : seqs_) {
      int32_t longest = 0;
      for (const auto& l : s.layers) longest = std::max(longest, static_cast<int32_t>(l.size()));
      if (longest < shape_.max_context) continue;
      const int32_t cut = shape_.max_context / 4 + static_cast<int32_t>(pick(static_cast<size_t>(shape_.max_context / 4 + 1)));
      ++counts_.rpcs;
      auto r = client_->truncate_sequence(s.id, cut);
      if (!r.ok()) return failed("truncate", r.error()), false;
      ++counts_.outcomes["truncate"]["ok"];
      for (size_t l = 0; l < s.layers.size(); ++l) {
        auto& tokens = s.layers[l];
        if (static_cast<int32_t>(tokens.size()) > cut) tokens.resize(static_cast<size_t>(cut));
        if (l >= r->size() || !lengths_agree("truncate", (*r)[l], static_cast<int32_t>(tokens.size()))) return false;
      }
    }
    return live_;
  }

  // Every sequence's lengths from GetSequence, then a decode (no append) of
  // each layer against the reference.
  void verify() {
    for (KnownSequence& s : seqs_) {
      ++counts_.rpcs;
      auto info = client_->get_sequence(s.id);
      if (!info.ok()) return failed("verify", info.error());
      ++counts_.verified_sequences;
      for (int32_t layer = 0; layer < config_.num_layers; ++layer) {
        const int32_t have = info->layer_lengths[static_cast<size_t>(layer)], want = length(s, layer);
        counts_.lost += std::max(0, want - have);
        counts_.duplicates += std::max(0, have - want);
        if (have != want) {
          problem(fmt::format("sequence {} layer {}: the server holds {} tokens, the client appended {}", s.id,
                              layer, have, want));
          continue;
        }
        const std::vector<float> q = random_q(1);
        ++counts_.rpcs;
        auto r = client_->decode({.layer = layer, .sequence_ids = {s.id}, .q = q});
        if (!r.ok()) return failed("verify", r.error());
        check_output(s, layer, q, r->output);
      }
      ++counts_.outcomes["verify"]["ok"];
      release(s);
    }
  }

  void check_output(const KnownSequence& s, int32_t layer, std::span<const float> q, std::span<const float> got) {
    const auto& tokens = s.layers[static_cast<size_t>(layer)];
    const int64_t kv_row = config_.kv_row();
    std::vector<float> k(tokens.size() * static_cast<size_t>(kv_row)), v(k.size());
    for (size_t t = 0; t < tokens.size(); ++t) {
      token_kv(tokens[t], kv_row, k.data() + static_cast<int64_t>(t) * kv_row, v.data() + static_cast<int64_t>(t) * kv_row);
    }
    const client::ReferenceRow want = client::reference_decode(layout_, q, k, v, 0);
    // The inputs are exact in the cache, so only fp32 accumulation separates
    // the two; one misplaced token of a few hundred moves outputs by ~1e-3.
    const client::Comparison c = client::compare(want.out, got, 1e-4, 1e-4);
    ++counts_.checked_decodes;
    if (!c.pass) {
      ++counts_.mismatches;
      problem(fmt::format("sequence {} layer {} at length {}: output differs from the reference by {:.3g}", s.id,
                          layer, tokens.size(), c.max_abs_error));
    }
  }

  bool lengths_agree(const char* op, int32_t got, int32_t want) {
    if (got == want) return true;
    (got < want ? counts_.lost : counts_.duplicates) += std::abs(got - want);
    problem(fmt::format("{}: the server answered length {}, the client knows {}", op, got, want));
    live_ = false;  // its knowledge of the sequence is no longer exact
    return false;
  }

  // The revoked client's calls of every kind, each expected UNAUTHENTICATED.
  void probe_after_revocation() {
    auto expect = [&](const char* what, const client::Error* e) {
      ++counts_.rpcs;
      const bool refused = e != nullptr && e->code() == ErrorCode::kUnauthenticated;
      ++counts_.outcomes[std::string("after_revocation_") + what][refused ? "unauthenticated"
                                                              : e == nullptr ? "served" : e->code_name()];
      if (!refused) problem(fmt::format("{} after the revocation: expected UNAUTHENTICATED, received {}", what,
                                        e == nullptr ? std::string("an answer") : e->to_string()));
    };
    const uint64_t id = seqs_.empty() ? 1 : seqs_.front().id;
    const std::vector<float> q = random_q(1), kv(static_cast<size_t>(config_.kv_row()), 0.25f);
    auto unary = client_->decode({.layer = 0, .sequence_ids = {id}, .q = q});
    expect("decode", unary.ok() ? nullptr : &unary.error());
    if (!stream_) {
      auto s = client_->open_stream();
      if (s.ok()) stream_ = std::move(*s);
    }
    if (stream_) {
      auto streamed = stream_->call({.layer = 0, .sequence_ids = {id}, .q = q, .k = kv, .v = kv});
      expect("stream", streamed.ok() ? nullptr : &streamed.error());
    }
    auto appended = client_->append_kv(id, 0, kv, kv);
    expect("append_kv", appended.ok() ? nullptr : &appended.error());
    auto created = client_->create_sequence("after-revocation");
    expect("create", created.ok() ? nullptr : &created.error());
    auto info = client_->get_sequence(id);
    expect("get_sequence", info.ok() ? nullptr : &info.error());
  }

  void failed(const std::string& op, const client::Error& e) {
    if (e.code() == ErrorCode::kUnauthenticated && revoked_ != nullptr && revoked_->load()) {
      // The revocation reached the server: nothing this call sent was applied.
      ++counts_.outcomes[op]["revoked"];
      refused_after_revocation_ = true;
      live_ = false;
      return;
    }
    const bool draining = e.code() == ErrorCode::kUnavailable;
    ++counts_.outcomes[op][draining ? "unavailable" : e.code_name()];
    if (!draining) problem(fmt::format("{}: {}", op, e.to_string()));
    live_ = false;
  }

  void problem(std::string what) {
    if (counts_.first_problem.empty()) counts_.first_problem = fmt::format("client {}: {}", index_, what);
  }

  std::vector<float> random_q(int64_t rows) {
    std::vector<float> q(static_cast<size_t>(rows * config_.q_row()));
    for (float& x : q) x = eighth(rng_());
    return q;
  }
  int32_t random_layer() { return static_cast<int32_t>(pick(static_cast<size_t>(config_.num_layers))); }
  size_t pick(size_t n) { return static_cast<size_t>(rng_() % n); }
  uint64_t next_key() { return (static_cast<uint64_t>(index_) << 40) | ++key_counter_; }
  static int32_t length(const KnownSequence& s, int32_t layer) {
    return static_cast<int32_t>(s.layers[static_cast<size_t>(layer)].size());
  }

  const client::ServerConfig& config_;
  const SoakShape& shape_;
  const int32_t index_;
  const std::atomic<bool>& skip_verify_;
  const std::atomic<bool>* revoked_;  // this client's token is being revoked; null: never
  bool refused_after_revocation_ = false;
  std::mt19937_64 rng_;
  client::HeadLayout layout_;
  std::unique_ptr<client::Client> client_, tiny_;
  std::unique_ptr<client::DecodeStream> stream_;
  std::vector<KnownSequence> seqs_;
  SoakCounts counts_;
  bool live_ = true;
  int64_t decodes_ = 0;
  uint64_t key_counter_ = 0;
};

}  // namespace

void SoakCounts::add(const SoakCounts& o) {
  for (const auto& [op, by] : o.outcomes) {
    for (const auto& [outcome, n] : by) outcomes[op][outcome] += n;
  }
  rpcs += o.rpcs;
  lost += o.lost;
  duplicates += o.duplicates;
  mismatches += o.mismatches;
  checked_decodes += o.checked_decodes;
  verified_sequences += o.verified_sequences;
  unverified_revoked += o.unverified_revoked;
  if (first_problem.empty()) first_problem = o.first_problem;
}

int64_t SoakCounts::failures(bool draining) const {
  int64_t n = 0;
  for (const auto& [op, by] : outcomes) {
    for (const auto& [outcome, count] : by) {
      const bool fine = outcome == "ok" || outcome == "retried" || outcome == "replayed" || outcome == "gave_up" ||
                        outcome == "revoked" || outcome == "unauthenticated" ||
                        (draining && outcome == "unavailable");
      if (!fine) n += count;
    }
  }
  return n;
}

SoakCounts run_soak_client(const client::ConnectionFlags& server, const client::ServerConfig& config,
                           const SoakShape& shape, int32_t index, const std::atomic<bool>& skip_verify,
                           const std::atomic<bool>* revoked) {
  SoakClient c(server, config, shape, index, skip_verify, revoked);
  return c.run();
}

}  // namespace pagoda::bench
