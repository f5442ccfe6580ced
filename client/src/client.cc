#include "pagoda/client/client.h"

#include "pagoda/geometry_rules.h"

#include <algorithm>
#include <thread>

#include <fmt/format.h>
#include <grpcpp/create_channel.h>
#include <grpcpp/security/credentials.h>
#include <grpcpp/support/channel_arguments.h>

#include "client_impl.h"
#include "pagoda/client/grpc_error.h"
#include "wire.h"

namespace pagoda::client {

int64_t DecodeArgs::rows() const {
  if (q_lengths.empty()) return static_cast<int64_t>(sequence_ids.size());
  int64_t rows = 0;
  for (int32_t n : q_lengths) rows += n;
  return rows;
}

void Client::Impl::prepare(grpc::ClientContext& ctx) const {
  if (options.timeout.count() > 0) ctx.set_deadline(std::chrono::system_clock::now() + options.timeout);
  authorize(ctx);
}

void Client::Impl::authorize(grpc::ClientContext& ctx) const {
  if (!options.token.empty()) ctx.AddMetadata("authorization", "Bearer " + options.token);
}

namespace {

std::shared_ptr<grpc::ChannelCredentials> channel_credentials(const ClientOptions& o) {
  if (!o.tls) return grpc::InsecureChannelCredentials();
  grpc::SslCredentialsOptions ssl;
  ssl.pem_root_certs = o.tls_root_certs;
  ssl.pem_cert_chain = o.tls_cert_chain;
  ssl.pem_private_key = o.tls_private_key;
  return grpc::SslCredentials(ssl);
}

}  // namespace

std::unique_ptr<Client> Client::connect(const std::string& address, ClientOptions options) {
  auto impl = std::make_unique<Impl>();
  impl->address = address;
  impl->options = options;
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(options.max_message_bytes);
  args.SetMaxSendMessageSize(options.max_message_bytes);
  impl->channel = grpc::CreateCustomChannel(address, channel_credentials(options), args);
  impl->stub = v1::DecodeAttention::NewStub(impl->channel);
  return std::unique_ptr<Client>(new Client(std::move(impl)));
}

Client::Client(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Client::~Client() = default;

const std::string& Client::address() const { return impl_->address; }

Result<ServerConfig> Client::refresh_config() {
  grpc::ClientContext ctx;
  impl_->prepare(ctx);
  v1::GetConfigResponse resp;
  const grpc::Status st = impl_->stub->GetConfig(&ctx, v1::GetConfigRequest(), &resp);
  if (!st.ok()) return error_from_grpc(st, "GetConfig");
  ServerConfig config = wire::config_from_proto(resp);
  std::lock_guard lock(impl_->config_mu);
  impl_->config = config;
  return config;
}

Result<ServerConfig> Client::config() {
  {
    std::lock_guard lock(impl_->config_mu);
    if (impl_->config) return *impl_->config;
  }
  return refresh_config();
}

Result<uint64_t> Client::create_sequence(const std::string& label) {
  grpc::ClientContext ctx;
  impl_->prepare(ctx);
  v1::CreateSequenceRequest req;
  req.set_label(label);
  v1::CreateSequenceResponse resp;
  const grpc::Status st = impl_->stub->CreateSequence(&ctx, req, &resp);
  if (!st.ok()) return error_from_grpc(st, "CreateSequence");
  return resp.sequence_id();
}

Result<int32_t> Client::append_kv(uint64_t sequence_id, int32_t layer, std::span<const float> k,
                                  std::span<const float> v, DType dtype,
                                  std::optional<int32_t> expected_length) {
  auto config = this->config();
  if (!config.ok()) return config.error();
  const int64_t row = config->kv_row();
  if (config->latent()) {
    if (!v.empty() || k.empty() || k.size() % row != 0) {
      return invalid_argument(fmt::format(
          "k, v: expected k alone, a multiple of num_kv_heads * head_dim = {}, on a latent-attention server "
          "(V is the first {} elements of k's rows), received {} and {}",
          row, config->v_head_dim, k.size(), v.size()));
    }
  } else if (k.size() != v.size() || k.size() % row != 0) {
    return invalid_argument(fmt::format(
        "k, v: expected equal sizes, a multiple of num_kv_heads * head_dim = {}, received {} and {}",
        row, k.size(), v.size()));
  }
  const auto tokens = static_cast<int64_t>(k.size()) / row;
  v1::AppendKVRequest req;
  req.set_sequence_id(sequence_id);
  req.set_layer(layer);
  wire::fill_tensor(*req.mutable_k(), k, dtype, {tokens, config->num_kv_heads, config->head_dim});
  if (!v.empty()) wire::fill_tensor(*req.mutable_v(), v, dtype, {tokens, config->num_kv_heads, config->head_dim});
  if (expected_length) req.set_expected_length(*expected_length);
  grpc::ClientContext ctx;
  impl_->prepare(ctx);
  v1::AppendKVResponse resp;
  const grpc::Status st = impl_->stub->AppendKV(&ctx, req, &resp);
  if (!st.ok()) return error_from_grpc(st, "AppendKV");
  return resp.layer_length();
}

Result<DecodeResult> Client::decode(const DecodeArgs& args) {
  auto config = this->config();
  if (!config.ok()) return config.error();
  auto req = wire::decode_request(args, *config);
  if (!req.ok()) return req.error();
  grpc::ClientContext ctx;
  impl_->prepare(ctx);
  v1::DecodeResponse resp;
  const grpc::Status st = impl_->stub->Decode(&ctx, *req, &resp);
  if (!st.ok()) return error_from_grpc(st, "Decode");
  return wire::decode_result(resp, *config, args.rows());
}

namespace {

bool retryable(ErrorCode code) { return code == ErrorCode::kDeadlineExceeded || code == ErrorCode::kUnavailable; }

}  // namespace

Result<DecodeResult> Client::decode_step(const DecodeArgs& args, const RetryOptions& retry) {
  std::chrono::milliseconds wait = retry.backoff;
  int32_t calls = 0;
  // Every call below retries on DEADLINE_EXCEEDED and UNAVAILABLE, sharing one
  // budget of retry.attempts calls.
  auto with_retries = [&](auto call) {
    for (;;) {
      auto r = call();
      ++calls;
      if (r.ok() || !retryable(r.error().code()) || calls >= retry.attempts) return r;
      std::this_thread::sleep_for(wait);
      wait = std::min(2 * wait, std::max(retry.max_backoff, retry.backoff));
    }
  };
  // The geometry (a GetConfig on a client's first call, which a tiny deadline
  // can cut short like any other) with a budget of its own: `attempts` counts
  // the step's calls.
  auto config = with_retries([&] { return this->config(); });
  if (!config.ok()) return config.error();
  calls = 0;
  wait = retry.backoff;
  // k alone on a latent-attention server (V is its prefix).
  if (args.k.empty() || (args.v.empty() && !config->latent())) {
    return invalid_argument("k, v: expected the step's new K/V (decode_step appends), received none");
  }
  // The layer's length of every sequence now.
  auto lengths_now = [&]() -> Result<std::vector<int32_t>> {
    std::vector<int32_t> lengths;
    for (uint64_t id : args.sequence_ids) {
      auto info = with_retries([&] { return get_sequence(id); });
      if (!info.ok()) return info.error();
      // The server's own rule and wording (pagoda_core).
      if (Status s = check_layer(args.layer, static_cast<int32_t>(info->layer_lengths.size())); !s.ok()) {
        return invalid_argument(s.message());
      }
      lengths.push_back(info->layer_lengths[static_cast<size_t>(args.layer)]);
    }
    return lengths;
  };
  DecodeArgs step = args;
  if (step.expected_lengths.empty()) {
    auto lengths = lengths_now();
    if (!lengths.ok()) return lengths.error();
    step.expected_lengths = std::move(*lengths);
  }
  auto r = with_retries([&] { return decode(step); });
  if (r.ok()) {
    r->attempts = calls;
    return r;
  }
  if (r.error().code() != ErrorCode::kFailedPrecondition) return r;
  // Applied by an attempt whose answer was lost? Then every sequence holds
  // expected + rows tokens, and a Decode without k/v re-reads the step.
  auto lengths = lengths_now();
  // Not known whether the step was applied: the caller gets the retryable
  // error, not the precondition failure that may be its own earlier attempt.
  if (!lengths.ok()) return lengths.error();
  DecodeArgs reread = step;
  reread.k = {};
  reread.v = {};
  for (size_t i = 0; i < reread.expected_lengths.size(); ++i) {
    reread.expected_lengths[i] += reread.q_lengths.empty() ? 1 : reread.q_lengths[i];
    if ((*lengths)[i] != reread.expected_lengths[i]) return r.error();  // changed by someone else
  }
  auto again = with_retries([&] { return decode(reread); });
  if (again.ok()) {
    again->attempts = calls;
    again->replayed = true;
  }
  return again;
}

Result<uint64_t> Client::fork_sequence(uint64_t source_id) {
  Result<std::vector<uint64_t>> ids = fork_sequences(source_id, 1);
  if (!ids.ok()) return ids.error();
  return ids->front();
}

Result<std::vector<uint64_t>> Client::fork_sequences(uint64_t source_id, int32_t count) {
  grpc::ClientContext ctx;
  impl_->prepare(ctx);
  v1::ForkSequenceRequest req;
  req.set_source_id(source_id);
  req.set_count(count);
  v1::ForkSequenceResponse resp;
  const grpc::Status st = impl_->stub->ForkSequence(&ctx, req, &resp);
  if (!st.ok()) return error_from_grpc(st, "ForkSequence");
  if (resp.sequence_ids_size() == 0) return std::vector<uint64_t>{resp.sequence_id()};  // a server before count
  return std::vector<uint64_t>(resp.sequence_ids().begin(), resp.sequence_ids().end());
}

Outcome Client::free_sequence(uint64_t sequence_id) {
  grpc::ClientContext ctx;
  impl_->prepare(ctx);
  v1::FreeSequenceRequest req;
  req.set_sequence_id(sequence_id);
  v1::FreeSequenceResponse resp;
  const grpc::Status st = impl_->stub->FreeSequence(&ctx, req, &resp);
  if (!st.ok()) return error_from_grpc(st, "FreeSequence");
  return Done{};
}

Outcome Client::register_shared_memory(const std::string& name, const std::string& key, int64_t offset,
                                       int64_t byte_size) {
  grpc::ClientContext ctx;
  impl_->prepare(ctx);
  v1::RegisterSharedMemoryRequest req;
  req.set_name(name);
  req.set_key(key);
  req.set_offset(offset);
  req.set_byte_size(byte_size);
  v1::RegisterSharedMemoryResponse resp;
  const grpc::Status st = impl_->stub->RegisterSharedMemory(&ctx, req, &resp);
  if (!st.ok()) return error_from_grpc(st, "RegisterSharedMemory");
  return Done{};
}

Outcome Client::unregister_shared_memory(const std::string& name) {
  grpc::ClientContext ctx;
  impl_->prepare(ctx);
  v1::UnregisterSharedMemoryRequest req;
  req.set_name(name);
  v1::UnregisterSharedMemoryResponse resp;
  const grpc::Status st = impl_->stub->UnregisterSharedMemory(&ctx, req, &resp);
  if (!st.ok()) return error_from_grpc(st, "UnregisterSharedMemory");
  return Done{};
}

Result<std::vector<SharedMemoryStatus>> Client::shared_memory_status(const std::string& name) {
  grpc::ClientContext ctx;
  impl_->prepare(ctx);
  v1::GetSharedMemoryStatusRequest req;
  req.set_name(name);
  v1::GetSharedMemoryStatusResponse resp;
  const grpc::Status st = impl_->stub->GetSharedMemoryStatus(&ctx, req, &resp);
  if (!st.ok()) return error_from_grpc(st, "GetSharedMemoryStatus");
  std::vector<SharedMemoryStatus> out;
  for (const auto& r : resp.regions()) out.push_back({r.name(), r.key(), r.offset(), r.byte_size()});
  return out;
}

Result<std::vector<int32_t>> Client::truncate_sequence(uint64_t sequence_id, int32_t length) {
  grpc::ClientContext ctx;
  impl_->prepare(ctx);
  v1::TruncateSequenceRequest req;
  req.set_sequence_id(sequence_id);
  req.set_length(length);
  v1::TruncateSequenceResponse resp;
  const grpc::Status st = impl_->stub->TruncateSequence(&ctx, req, &resp);
  if (!st.ok()) return error_from_grpc(st, "TruncateSequence");
  return std::vector<int32_t>(resp.layer_lengths().begin(), resp.layer_lengths().end());
}

Result<SequenceInfo> Client::get_sequence(uint64_t sequence_id) {
  grpc::ClientContext ctx;
  impl_->prepare(ctx);
  v1::GetSequenceRequest req;
  req.set_sequence_id(sequence_id);
  v1::GetSequenceResponse resp;
  const grpc::Status st = impl_->stub->GetSequence(&ctx, req, &resp);
  if (!st.ok()) return error_from_grpc(st, "GetSequence");
  SequenceInfo info;
  info.sequence_id = resp.sequence_id();
  info.layer_lengths.assign(resp.layer_lengths().begin(), resp.layer_lengths().end());
  info.blocks_held = resp.blocks_held();
  info.label = resp.label();
  return info;
}

Result<std::unique_ptr<DecodeStream>> Client::open_stream(std::chrono::milliseconds session_timeout) {
  auto config = this->config();
  if (!config.ok()) return config.error();
  auto impl = std::make_unique<DecodeStream::Impl>();
  impl->config = *config;
  impl->ctx = std::make_unique<grpc::ClientContext>();
  if (session_timeout.count() > 0)
    impl->ctx->set_deadline(std::chrono::system_clock::now() + session_timeout);
  impl_->authorize(*impl->ctx);
  impl->rw = impl_->stub->DecodeStream(impl->ctx.get());
  return std::make_unique<DecodeStream>(std::move(impl));
}

}  // namespace pagoda::client
