#pragma once
// The C++ client of pagoda.v1.DecodeAttention: typed calls with fp32 tensors in
// and out (converted to and from the wire dtype), per-call deadlines, and errors
// as Result values carrying the gRPC code and the server's message.
//
//   auto client = pagoda::client::Client::connect("127.0.0.1:50051");
//   auto config = client->config();              // GetConfig, cached
//   auto seq = client->create_sequence("chat-1");
//   client->append_kv(*seq, /*layer=*/0, k, v);  // [n, kv_heads, head_dim] each
//   auto out = client->decode({.layer = 0, .sequence_ids = {*seq}, .q = q});

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "pagoda/client/decode_stream.h"
#include "pagoda/client/error.h"
#include "pagoda/client/types.h"

namespace pagoda::client {

struct ClientOptions {
  // Deadline of every call; zero means none (microseconds, so that a test or
  // a soak can set deadlines shorter than a call; milliseconds convert).
  std::chrono::microseconds timeout{0};
  // Largest message the channel sends and receives (the server's own limit is
  // reported by GetConfig).
  int max_message_bytes = 256 << 20;
  // Bearer token sent as `authorization: Bearer TOKEN` on every call (a
  // server with --auth-tokens requires one); empty: none.
  std::string token{};
  // TLS: `tls` on, the server's certificate verified against tls_root_certs
  // (PEM; empty: the system's roots). tls_cert_chain + tls_private_key (PEM)
  // are this client's certificate, for a server that requires one (mTLS).
  bool tls = false;
  std::string tls_root_certs{};
  std::string tls_cert_chain{};
  std::string tls_private_key{};
};

class Client {
 public:
  // Creates the channel (plaintext unless options.tls); nothing is sent
  // until the first call.
  static std::unique_ptr<Client> connect(const std::string& address, ClientOptions options = {});
  ~Client();
  Client(const Client&) = delete;
  Client& operator=(const Client&) = delete;

  const std::string& address() const;

  // GetConfig, fetched on first use and kept (geometry does not change while a
  // server runs); refresh() fetches it again (e.g. for free_blocks).
  Result<ServerConfig> config();
  Result<ServerConfig> refresh_config();

  Result<uint64_t> create_sequence(const std::string& label = {});
  // Appends n tokens to one layer: k and v are [n, num_kv_heads, head_dim], sent
  // as `dtype`; on a latent-attention server (ServerConfig::latent()) k alone,
  // v empty: V is the first v_head_dim elements of k's rows. With `expected_length`, the layer must hold exactly that many
  // tokens first (FAILED_PRECONDITION otherwise, nothing appended): a retried
  // append is then safe. Returns the layer's new length.
  Result<int32_t> append_kv(uint64_t sequence_id, int32_t layer, std::span<const float> k,
                            std::span<const float> v, DType dtype = DType::kFloat32,
                            std::optional<int32_t> expected_length = std::nullopt);
  Result<DecodeResult> decode(const DecodeArgs& args);
  // One decode step that is safe to retry (docs/design.md §11): appends args.k/v and
  // attends, sending expected_lengths (read with GetSequence first when args
  // has none). A call that timed out or found the server unavailable is sent
  // again; a FAILED_PRECONDITION whose sequences hold exactly expected + rows
  // tokens means an earlier attempt was applied, and the step is answered by
  // re-reading (a Decode without k/v, the same output) instead of appending
  // twice. When the retries run out it returns the last retryable error
  // (DEADLINE_EXCEEDED or UNAVAILABLE): whether the step was applied is then
  // unknown, and calling decode_step again with the same args settles it
  // (every attempt carries the expected lengths, so at most one appends).
  // INVALID_ARGUMENT when args carries no k/v.
  Result<DecodeResult> decode_step(const DecodeArgs& args, const RetryOptions& retry = {});
  Result<uint64_t> fork_sequence(uint64_t source_id);
  // `count` forks in one call, all or none (parallel sampling, beam search).
  Result<std::vector<uint64_t>> fork_sequences(uint64_t source_id, int32_t count);
  Outcome free_sequence(uint64_t sequence_id);
  // Shared memory (docs/design.md §15): registers [offset, offset + byte_size)
  // of the object `key` under `name` (the server maps it; byte_size > 0);
  // unregisters one name or, empty, all of the caller's; lists them.
  Outcome register_shared_memory(const std::string& name, const std::string& key, int64_t offset,
                                 int64_t byte_size);
  Outcome unregister_shared_memory(const std::string& name = "");
  Result<std::vector<SharedMemoryStatus>> shared_memory_status(const std::string& name = "");
  // Cuts every layer longer than `length` to it (rejected draft tokens);
  // returns the layers' lengths after the cut.
  Result<std::vector<int32_t>> truncate_sequence(uint64_t sequence_id, int32_t length);
  Result<SequenceInfo> get_sequence(uint64_t sequence_id);
  // Moves a sequence to `target` (docs/design.md §13) and returns its id there: a
  // bulk stage while the sequence keeps serving, catch-up stages of the
  // tokens appended meanwhile, then options.hold (the caller stops appending
  // to the sequence) and a last stage of what is left; the source is freed
  // after it. Downtime is the last stage alone, however long the sequence.
  // FAILED_PRECONDITION (and the source kept) when the source still grew
  // during the last stage.
  Result<MigrateResult> migrate(uint64_t sequence_id, Client& target, const MigrateOptions& options = {});
  // grpc.health.v1.Health/Check for `service` ("" = the whole server).
  Result<ServingStatus> health(const std::string& service = {});

  // A DecodeStream session on this client's channel. The per-call timeout does
  // not apply to a stream (it lives for many steps); `session_timeout`, when
  // non-zero, is the deadline of the whole session.
  Result<std::unique_ptr<DecodeStream>> open_stream(
      std::chrono::milliseconds session_timeout = std::chrono::milliseconds{0});

  struct Impl;

 private:
  explicit Client(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace pagoda::client
