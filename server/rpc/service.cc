// Unary handlers of pagoda.v1.DecodeAttention (DecodeStream is in decode_stream.cc).
#include "rpc/service.h"

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "rpc/admission.h"
#include "rpc/decode_response.h"
#include "rpc/grpc_status.h"

namespace pagoda {
namespace {

double micros_since(EngineClock::time_point t0) {
  return std::chrono::duration<double, std::micro>(EngineClock::now() - t0).count();
}

std::string describe(const v1::DecodeRequest& r) {
  return fmt::format("request_id={} layer={}", r.request_id(), r.layer());
}

}  // namespace

namespace {

// The half every engine-computed unary call shares: the call is counted from
// construction to OnDone, a cancellation reaches the queued work item, and the
// finish is observed once (with `what` naming the request when it failed).
template <typename Work>
class EngineCall : public grpc::ServerUnaryReactor, public WorkDone {
 public:
  void OnCancel() override { work_.cancelled.store(true, std::memory_order_relaxed); }
  void OnDone() override {
    service_.call_done();
    delete this;
  }

 protected:
  explicit EngineCall(DecodeAttentionService& service) : service_(service) { service.call_started(); }

  template <typename DescribeRequest>
  void finish_call(RpcMethod method, const Status& status, DescribeRequest describe) {
    if (status.ok()) {
      service_.observe_call(method, received_, status);
    } else {
      service_.observe_call(method, received_, status, describe());
    }
    Finish(to_grpc_status(status));
  }

  const EngineClock::time_point received_ = EngineClock::now();
  DecodeAttentionService& service_;
  Work work_;
};

// One unary Decode queued for the engine: finished from the engine's thread.
// (A lone small one never gets here: the handler runs it itself.)
class DecodeCall final : public EngineCall<DecodeWork> {
 public:
  // `validated`: the request decoded and its response prepared by the handler.
  DecodeCall(DecodeAttentionService& service, const v1::DecodeRequest& request, v1::DecodeResponse& response,
             const DecodeWork& validated)
      : EngineCall(service), request_(request), response_(response) {
    work_.take_request(validated);
    work_.deadline = validated.deadline;
    work_.done = this;
    service.engine().queue(&work_);  // the handler's try_run_inline declined it
  }

  void work_done(const Status& status) override {
    if (status.ok()) finish_response(work_, service_.settings().mode, micros_since(received_), response_);
    finish_call(RpcMethod::kDecode, status, [&] { return describe(request_); });
  }

 private:
  const v1::DecodeRequest& request_;
  v1::DecodeResponse& response_;
};

// One AppendKV: the write (and any dtype conversion) runs on the engine.
class AppendCall final : public EngineCall<AppendWork> {
 public:
  AppendCall(DecodeAttentionService& service, const grpc::CallbackServerContext& ctx,
             const v1::AppendKVRequest& request, v1::AppendKVResponse& response, TenantId tenant)
      : EngineCall(service), request_(request), response_(response) {
    const Status status = admit_append(request, static_cast<int64_t>(request.ByteSizeLong()), service.settings(),
                                       work_, service.sources_of(tenant));
    work_.tenant = tenant;
    if (!status.ok()) {
      work_done(status);
      return;
    }
    work_.deadline = ctx.deadline();
    work_.done = this;
    service.engine().submit(&work_);
  }

  void work_done(const Status& status) override {
    if (status.ok()) response_.set_layer_length(work_.layer_length);
    finish_call(RpcMethod::kAppendKV, status, [&] {
      return fmt::format("sequence_id={} layer={}", request_.sequence_id(), request_.layer());
    });
  }

 private:
  const v1::AppendKVRequest& request_;
  v1::AppendKVResponse& response_;
};

// A Decode the handler runs on its own thread (Engine::try_run_inline).
struct InlineDecode final : public WorkDone {
  DecodeWork work;
  Status status;
  void work_done(const Status& s) override { status = s; }
};

}  // namespace

Status draining_status() { return Unavailable("server: draining (shutting down); send new calls to another replica"); }

void DecodeAttentionService::observe_call(RpcMethod method, EngineClock::time_point received, const Status& status,
                                          std::string_view what) {
  const double seconds = std::chrono::duration<double>(EngineClock::now() - received).count();
  const int code = static_cast<int>(status.code());
  if (status.code() == StatusCode::kUnavailable && draining()) {
    refused_while_draining_.fetch_add(1, std::memory_order_acq_rel);
  }
  metrics_.observe_rpc(method, code, seconds);
  if (status.ok()) return;
  // Anyone can fail authentication as fast as they can send: those lines are rate-limited.
  int64_t dropped = 0;
  if (status.code() == StatusCode::kUnauthenticated && !auth_failure_log_.allow(&dropped)) return;
  // The caller's mistakes (and refusals while draining) are warnings; the server's own failures are errors.
  const bool server_fault = status.code() == StatusCode::kInternal;
  spdlog::log(server_fault ? spdlog::level::err : spdlog::level::warn, "{} {}{}failed: {} {}{}", rpc_method_name(method),
              what, what.empty() ? "" : " ", grpc_code_name(code), status.message(),
              dropped > 0 ? fmt::format(" ({} more failed authentications not logged)", dropped) : "");
}

grpc::ServerUnaryReactor* DecodeAttentionService::finish_unary(grpc::CallbackServerContext* ctx, RpcMethod method,
                                                               EngineClock::time_point received, const Status& status,
                                                               std::string_view what) {
  observe_call(method, received, status, what);
  grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
  reactor->Finish(to_grpc_status(status));
  return reactor;
}

DecodeAttentionService::DecodeAttentionService(const ServiceSettings& settings, Backend& backend, CacheManager& cache,
                                               Engine& engine, Metrics& metrics, const Authenticator& auth,
                                               SharedMemoryRegistry& shm)
    : settings_(settings),
      backend_(backend),
      cache_(cache),
      engine_(engine),
      metrics_(metrics),
      auth_(auth),
      shm_(shm) {}

StatusOr<TenantId> DecodeAttentionService::admit_call(const grpc::CallbackServerContext& ctx) {
  if (draining()) return draining_status();
  return tenant_of(ctx);
}

std::optional<std::string> DecodeAttentionService::authorization_of(const grpc::CallbackServerContext& ctx) {
  const auto& metadata = ctx.client_metadata();
  if (auto it = metadata.find("authorization"); it != metadata.end()) {
    return std::string(it->second.data(), it->second.size());
  }
  return std::nullopt;
}

StatusOr<TenantId> DecodeAttentionService::tenant_of(const grpc::CallbackServerContext& ctx) {
  if (!auth_.enabled()) return kDefaultTenant;
  std::optional<std::string_view> header;
  const auto& metadata = ctx.client_metadata();
  if (auto it = metadata.find("authorization"); it != metadata.end()) {
    header = std::string_view(it->second.data(), it->second.size());
  }
  return tenant_for(header);
}

StatusOr<TenantId> DecodeAttentionService::tenant_for(std::optional<std::string_view> header) {
  auto who = auth_.authenticate(header);
  if (auto* tenant = std::get_if<TenantId>(&who)) {
    metrics_.add_tenant_request(*tenant, [&] { return auth_.tenant_name(*tenant); });
    return *tenant;
  }
  const auto& refusal = std::get<Authenticator::Refusal>(who);
  metrics_.add_auth_failure(auth_failure_name(refusal.reason));
  return refusal.status;
}

grpc::ServerUnaryReactor* DecodeAttentionService::GetConfig(grpc::CallbackServerContext* ctx,
                                                            const v1::GetConfigRequest*,
                                                            v1::GetConfigResponse* r) {
  const auto t0 = EngineClock::now();
  StatusOr<TenantId> tenant = admit_call(*ctx);
  if (!tenant.ok()) return finish_unary(ctx, RpcMethod::kGetConfig, t0, tenant.status());
  const CacheGeometry& g = settings_.geometry;
  r->set_num_layers(g.num_layers);
  r->set_num_q_heads(g.num_q_heads);
  r->set_num_kv_heads(g.num_kv_heads);
  r->set_head_dim(g.head_dim);
  r->set_v_head_dim(g.v_dim());
  r->set_block_size(g.block_size);
  r->set_cache_dtype(to_wire(g.dtype));
  r->set_total_blocks(cache_.total_blocks());
  r->set_free_blocks(cache_.free_blocks());
  r->set_split_tokens(settings_.split_tokens);
  r->set_deterministic(settings_.mode == SplitMode::kDeterministic);
  r->set_backend(backend_.name());
  r->set_device_name(backend_.device_name());
  r->set_version(PAGODA_VERSION);
  r->set_max_message_bytes(settings_.max_message_bytes);
  r->set_max_batch(settings_.max_batch);
  r->set_max_batch_wait_us(settings_.max_batch_wait_us);
  for (int32_t l = 0; l < g.num_layers; ++l) {
    r->add_k_scales(backend_.kv_scale(l).k);
    r->add_v_scales(backend_.kv_scale(l).v);
  }
  r->set_max_label_bytes(settings_.max_label_bytes);
  r->set_max_request_tokens(settings_.max_request_tokens);
  r->set_max_request_blocks(settings_.max_request_blocks);
  r->set_max_stream_in_flight(settings_.max_stream_in_flight);
  r->set_idle_ttl_seconds(settings_.idle_ttl);
  const TenantLimits limits = cache_.limits(*tenant);
  const TenantUsage usage = cache_.usage(*tenant);
  r->set_tenant(auth_.tenant_name(*tenant));
  r->set_tenant_max_blocks(limits.max_blocks);
  r->set_tenant_max_sequences(limits.max_sequences);
  r->set_tenant_blocks(usage.blocks);
  r->set_tenant_sequences(usage.sequences);
  r->set_tls(settings_.tls);
  r->set_auth(auth_.enabled());
  r->set_max_sequences(settings_.max_sequences);
  r->set_max_sequence_tokens(settings_.max_sequence_tokens);
  return finish_unary(ctx, RpcMethod::kGetConfig, t0, Status::Ok());
}

grpc::ServerUnaryReactor* DecodeAttentionService::CreateSequence(grpc::CallbackServerContext* ctx,
                                                                 const v1::CreateSequenceRequest* request,
                                                                 v1::CreateSequenceResponse* response) {
  const auto t0 = EngineClock::now();
  StatusOr<TenantId> tenant = admit_call(*ctx);
  if (!tenant.ok()) return finish_unary(ctx, RpcMethod::kCreateSequence, t0, tenant.status());
  if (Status admitted = admit_create(*request, settings_); !admitted.ok()) {
    return finish_unary(ctx, RpcMethod::kCreateSequence, t0, admitted);
  }
  StatusOr<SequenceId> created = cache_.create_for(*tenant, request->label());
  if (!created.ok()) return finish_unary(ctx, RpcMethod::kCreateSequence, t0, created.status());
  const SequenceId id = *created;
  response->set_sequence_id(id);
  spdlog::debug("CreateSequence sequence_id={} label='{}'", id, request->label());
  return finish_unary(ctx, RpcMethod::kCreateSequence, t0, Status::Ok());
}

grpc::ServerUnaryReactor* DecodeAttentionService::AppendKV(grpc::CallbackServerContext* ctx,
                                                           const v1::AppendKVRequest* request,
                                                           v1::AppendKVResponse* response) {
  const auto t0 = EngineClock::now();
  StatusOr<TenantId> tenant = admit_call(*ctx);
  if (!tenant.ok()) return finish_unary(ctx, RpcMethod::kAppendKV, t0, tenant.status());
  return new AppendCall(*this, *ctx, *request, *response, *tenant);
}

grpc::ServerUnaryReactor* DecodeAttentionService::Decode(grpc::CallbackServerContext* ctx,
                                                         const v1::DecodeRequest* request,
                                                         v1::DecodeResponse* response) {
  const auto t0 = EngineClock::now();
  StatusOr<TenantId> tenant = admit_call(*ctx);
  if (!tenant.ok()) return finish_unary(ctx, RpcMethod::kDecode, t0, tenant.status());
  InlineDecode call;
  engine_.note_arriving();
  const Status admitted = admit_decode(*request, static_cast<int64_t>(request->ByteSizeLong()), settings_, call.work,
                                       *response, sources_of(*tenant));
  engine_.note_arrived();
  if (!admitted.ok()) return finish_unary(ctx, RpcMethod::kDecode, t0, admitted, describe(*request));
  call.work.tenant = *tenant;
  call.work.deadline = ctx->deadline();
  // Nothing can batch with a lone small call: it runs here and answers through
  // the default reactor, with no hop to an engine worker and back.
  call.work.done = &call;
  call_started();
  const bool ran = engine_.try_run_inline(&call.work);
  call_done();
  if (!ran) return new DecodeCall(*this, *request, *response, call.work);
  if (call.status.ok()) finish_response(call.work, settings_.mode, micros_since(t0), *response);
  return finish_unary(ctx, RpcMethod::kDecode, t0, call.status, call.status.ok() ? "" : describe(*request));
}

grpc::ServerUnaryReactor* DecodeAttentionService::ForkSequence(grpc::CallbackServerContext* ctx,
                                                               const v1::ForkSequenceRequest* request,
                                                               v1::ForkSequenceResponse* response) {
  const auto t0 = EngineClock::now();
  StatusOr<TenantId> tenant = admit_call(*ctx);
  if (!tenant.ok()) return finish_unary(ctx, RpcMethod::kForkSequence, t0, tenant.status());
  const StatusOr<int32_t> admitted = admit_fork(*request);
  if (!admitted.ok()) {
    return finish_unary(ctx, RpcMethod::kForkSequence, t0, admitted.status(),
                        fmt::format("source_id={}", request->source_id()));
  }
  const int32_t count = admitted.value();
  StatusOr<std::vector<SequenceId>> ids = cache_.fork(request->source_id(), *tenant, count);
  if (!ids.ok()) {
    return finish_unary(ctx, RpcMethod::kForkSequence, t0, ids.status(),
                        fmt::format("source_id={} count={}", request->source_id(), count));
  }
  response->set_sequence_id(ids->front());
  response->mutable_sequence_ids()->Add(ids->begin(), ids->end());
  spdlog::debug("ForkSequence source_id={} -> {} forks, first sequence_id={}", request->source_id(), count,
                ids->front());
  return finish_unary(ctx, RpcMethod::kForkSequence, t0, Status::Ok());
}

grpc::ServerUnaryReactor* DecodeAttentionService::FreeSequence(grpc::CallbackServerContext* ctx,
                                                               const v1::FreeSequenceRequest* request,
                                                               v1::FreeSequenceResponse*) {
  const auto t0 = EngineClock::now();
  StatusOr<TenantId> tenant = admit_call(*ctx);
  if (!tenant.ok()) return finish_unary(ctx, RpcMethod::kFreeSequence, t0, tenant.status());
  const Status status = cache_.free(request->sequence_id(), *tenant);
  if (!status.ok()) {
    return finish_unary(ctx, RpcMethod::kFreeSequence, t0, status, fmt::format("sequence_id={}", request->sequence_id()));
  }
  spdlog::debug("FreeSequence sequence_id={}", request->sequence_id());
  return finish_unary(ctx, RpcMethod::kFreeSequence, t0, status);
}

grpc::ServerUnaryReactor* DecodeAttentionService::GetSequence(grpc::CallbackServerContext* ctx,
                                                              const v1::GetSequenceRequest* request,
                                                              v1::GetSequenceResponse* response) {
  const auto t0 = EngineClock::now();
  StatusOr<TenantId> tenant = admit_call(*ctx);
  if (!tenant.ok()) return finish_unary(ctx, RpcMethod::kGetSequence, t0, tenant.status());
  StatusOr<SequenceInfo> info = cache_.info(request->sequence_id(), *tenant);
  if (info.ok()) {
    response->set_sequence_id(request->sequence_id());
    response->mutable_layer_lengths()->Add(info->layer_lengths.begin(), info->layer_lengths.end());
    response->set_blocks_held(info->blocks_held);
    response->set_label(info->label);
  }
  if (!info.ok()) {
    return finish_unary(ctx, RpcMethod::kGetSequence, t0, info.status(),
                        fmt::format("sequence_id={}", request->sequence_id()));
  }
  return finish_unary(ctx, RpcMethod::kGetSequence, t0, info.status());
}

grpc::ServerUnaryReactor* DecodeAttentionService::TruncateSequence(grpc::CallbackServerContext* ctx,
                                                                   const v1::TruncateSequenceRequest* request,
                                                                   v1::TruncateSequenceResponse* response) {
  const auto t0 = EngineClock::now();
  StatusOr<TenantId> tenant = admit_call(*ctx);
  if (!tenant.ok()) return finish_unary(ctx, RpcMethod::kTruncateSequence, t0, tenant.status());
  if (Status admitted = admit_truncate(*request); !admitted.ok()) {
    return finish_unary(ctx, RpcMethod::kTruncateSequence, t0, admitted,
                        fmt::format("sequence_id={} length={}", request->sequence_id(), request->length()));
  }
  StatusOr<std::vector<int32_t>> lengths = cache_.truncate(request->sequence_id(), request->length(), *tenant);
  if (!lengths.ok()) {
    return finish_unary(ctx, RpcMethod::kTruncateSequence, t0, lengths.status(),
                        fmt::format("sequence_id={} length={}", request->sequence_id(), request->length()));
  }
  response->mutable_layer_lengths()->Add(lengths->begin(), lengths->end());
  spdlog::debug("TruncateSequence sequence_id={} length={}", request->sequence_id(), request->length());
  return finish_unary(ctx, RpcMethod::kTruncateSequence, t0, Status::Ok());
}

}  // namespace pagoda
