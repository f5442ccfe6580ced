#pragma once
// Plain C++ views of the wire messages (pagoda.v1), so that users of the client
// need no protobuf or gRPC header.

#include <chrono>
#include <cstdint>
#include <optional>
#include <functional>
#include <span>
#include <string>
#include <vector>

#include "pagoda/client/shared_memory.h"
#include "pagoda/dtype.h"

namespace pagoda::client {

// GetConfig: the server's geometry, capacity and settings.
struct ServerConfig {
  int32_t num_layers = 0;
  int32_t num_q_heads = 0;
  int32_t num_kv_heads = 0;
  int32_t head_dim = 0;    // of q and K rows
  int32_t v_head_dim = 0;  // of V and output rows; less than head_dim: latent attention (V is K's prefix)
  int32_t block_size = 0;
  DType cache_dtype = DType::kFloat32;
  int32_t total_blocks = 0;
  int32_t free_blocks = 0;
  int32_t split_tokens = 0;
  bool deterministic = false;
  std::string backend;
  std::string device_name;
  std::string version;
  int64_t max_message_bytes = 0;
  int32_t max_batch = 0;
  int64_t max_batch_wait_us = 0;
  std::vector<float> k_scales;  // [num_layers] the cache stores x / scale
  std::vector<float> v_scales;  // [num_layers]
  // The calling tenant: name, quotas (0: no limit) and what it holds.
  std::string tenant;
  int64_t tenant_max_blocks = 0;
  int64_t tenant_max_sequences = 0;
  int64_t tenant_blocks = 0;
  int64_t tenant_sequences = 0;
  bool tls = false;   // the server serves TLS
  bool auth = false;  // the server requires a bearer token

  // Latent attention (MLA, docs/design.md §16): appends and decodes carry k
  // alone, whose rows' first v_head_dim elements are V.
  bool latent() const { return v_head_dim > 0 && v_head_dim < head_dim; }
  // Elements of one token's K (or V) in one layer: num_kv_heads * head_dim.
  int64_t kv_row() const { return static_cast<int64_t>(num_kv_heads) * head_dim; }
  // Elements of one sequence's query row: num_q_heads * head_dim.
  int64_t q_row() const { return static_cast<int64_t>(num_q_heads) * head_dim; }
  // Elements of one output row: num_q_heads * v_head_dim.
  int64_t out_row() const { return static_cast<int64_t>(num_q_heads) * (v_head_dim > 0 ? v_head_dim : head_dim); }
};

// One decode step of one layer for a batch of sequences. Spans are borrowed:
// they must outlive the call that takes the request.
struct DecodeArgs {
  int32_t layer = 0;
  std::vector<uint64_t> sequence_ids{};  // [batch], each at most once
  // Rows: sum(q_lengths) query rows (batch when q_lengths is empty), each
  // sequence's rows in request order (docs/design.md §9).
  std::span<const float> q{};            // [rows, num_q_heads, head_dim]
  std::span<const float> k{};            // [rows, num_kv_heads, head_dim] or empty
  // [rows, num_kv_heads, head_dim] or empty: with k, except on a latent-attention
  // server (ServerConfig::latent()), which takes k alone.
  std::span<const float> v{};
  DType q_dtype = DType::kFloat32;     // wire dtype of q (and of the output)
  DType kv_dtype = DType::kFloat32;    // wire dtype of k and v
  float scale = 0.f;                   // 0 -> 1/sqrt(head_dim); required (> 0) on a latent-attention server
  bool return_lse = false;
  uint64_t request_id = 0;             // 0: the client assigns one
  // Attention variants (docs/design.md §9); the defaults are plain causal decode.
  std::vector<int32_t> q_lengths{};         // [batch] query rows per sequence; empty: 1 each
  int32_t sliding_window = 0;               // 0: none; W: keys (p - W, p]
  float logits_soft_cap = 0.f;              // 0: none; c: c * tanh(score / c)
  std::vector<float> sinks{};               // [num_q_heads] natural-log sink logits; empty: none
  std::vector<int32_t> expected_lengths{};  // [batch] lengths before the append; empty: unchecked
  // Shared memory (docs/design.md §15; a server with --allow-shared-memory):
  // q / k / v lying in a registered region in q_dtype / kv_dtype, set instead
  // of the spans above; output_shm / lse_shm say where the server writes the
  // results (the result's output / lse then stay empty: read the region).
  std::optional<ShmRef> q_shm{}, k_shm{}, v_shm{}, output_shm{}, lse_shm{};

  // Query rows of the request: sum(q_lengths), or one per sequence.
  int64_t rows() const;
};

struct DecodeTiming {
  double queue_us = 0;
  double compute_us = 0;
  double total_us = 0;
};

struct DecodeResult {
  uint64_t request_id = 0;
  std::vector<float> output;    // [rows, num_q_heads, v_head_dim] (converted from q's dtype)
  std::vector<float> lse;       // [rows, num_q_heads] natural log; empty unless asked
  std::vector<int32_t> lengths; // [batch] tokens attended per sequence
  std::vector<int32_t> splits;  // [batch] split-KV chunks per sequence
  int32_t split_tokens = 0;
  bool deterministic = false;
  DecodeTiming timing;
  // Client::decode_step only: calls made, and whether an earlier attempt had
  // already appended (the result is then a re-read without k/v).
  int32_t attempts = 1;
  bool replayed = false;
};

// How Client::decode_step retries: on DEADLINE_EXCEEDED and UNAVAILABLE, up to
// `attempts` calls in all, waiting `backoff` in between, doubled each time up
// to `max_backoff` (as gRPC's retry policy caps its own): a long run of
// failures then waits in steps of max_backoff, not in ever longer ones.
struct RetryOptions {
  int32_t attempts = 4;
  std::chrono::milliseconds backoff{5};
  std::chrono::milliseconds max_backoff{1000};
};

// GetSequence.
struct SequenceInfo {
  uint64_t sequence_id = 0;
  std::vector<int32_t> layer_lengths;  // [num_layers]
  int32_t blocks_held = 0;
  std::string label;
};

// How Client::migrate stages a move.
struct MigrateOptions {
  // Catch-up stages after the bulk one, at most; each sends the tokens
  // appended during the one before.
  int32_t max_catch_up_stages = 3;
  // Stop catching up once the tokens left (all layers) are at most this.
  int64_t last_stage_tokens = 256;
  // Called before the last stage; returns once the caller appends no more to
  // the sequence. Empty: the caller is not appending.
  std::function<void()> hold;
  bool free_source = true;
};

struct MigrateResult {
  uint64_t sequence_id = 0;             // the sequence's id on the target
  std::vector<int32_t> layer_lengths;   // [num_layers] there
  int32_t stages = 0;                   // bulk + catch-up + last
  int64_t bytes = 0;                    // K/V bytes moved
  double last_stage_seconds = 0;        // from hold to the source freed: the downtime
};

// grpc.health.v1 serving status (numbers as the health proto's enum).
enum class ServingStatus : int { kUnknown = 0, kServing = 1, kNotServing = 2, kServiceUnknown = 3 };
const char* serving_status_name(ServingStatus s);

}  // namespace pagoda::client
