#pragma once
// The gRPC face of the server: pagoda.v1.DecodeAttention on the callback API.
// Handlers validate and either answer at once (bookkeeping calls) or hand work
// to the engine; no handler computes attention or waits on a lock held across
// compute. This header pulls in the generated gRPC code: include it only from
// the service and server translation units.

#include <atomic>
#include <mutex>
#include <unordered_set>

#include <grpcpp/grpcpp.h>

#include "auth/authenticator.h"
#include "cache/cache_manager.h"
#include "engine/engine.h"
#include "observability/cache_gauges.h"
#include "observability/log_rate_limit.h"
#include "observability/metrics.h"
#include "pagoda/backend.h"
#include "pagoda/v1/decode_attention.grpc.pb.h"

namespace pagoda {

// What the service validates requests against and reports in GetConfig.
struct ServiceSettings {
  CacheGeometry geometry;
  SplitMode mode = SplitMode::kDeterministic;
  int32_t split_tokens = 512;
  int32_t max_batch = 256;
  int64_t max_batch_wait_us = 50;
  int64_t max_message_bytes = int64_t{64} << 20;
  int32_t max_label_bytes = 256;
  int32_t max_request_tokens = 65536;
  int64_t max_request_blocks = 0;  // enforced by the cache manager; reported here
  int32_t max_stream_in_flight = 64;
  double idle_ttl = 0;             // enforced by the idle sweeper; reported here
  bool tls = false;                // reported in GetConfig
  int64_t max_sequences = 0;       // enforced by the cache manager; reported here
  int64_t max_sequence_tokens = 0; // enforced by the cache manager; reported here
};

class DecodeStreamCall;

// INVALID_ARGUMENT naming `field` when a request appends more than
// --max-request-tokens tokens.
Status check_request_tokens(const char* field, int64_t tokens, const ServiceSettings& settings);

// Every method typed on the callback API but DecodeStream, which reads and
// writes raw bytes and parses each message itself (decode_stream.cc says why).
using DecodeAttentionBase = v1::DecodeAttention::WithCallbackMethod_GetConfig<
    v1::DecodeAttention::WithCallbackMethod_CreateSequence<v1::DecodeAttention::WithCallbackMethod_AppendKV<
        v1::DecodeAttention::WithCallbackMethod_Decode<v1::DecodeAttention::WithRawCallbackMethod_DecodeStream<
            v1::DecodeAttention::WithCallbackMethod_ForkSequence<v1::DecodeAttention::WithCallbackMethod_FreeSequence<
                v1::DecodeAttention::WithCallbackMethod_GetSequence<
                    v1::DecodeAttention::WithCallbackMethod_TruncateSequence<v1::DecodeAttention::Service>>>>>>>>>;

class DecodeAttentionService final : public DecodeAttentionBase {
 public:
  // `auth` decides each call's tenant (off: every call is the default tenant).
  DecodeAttentionService(const ServiceSettings& settings, Backend& backend, CacheManager& cache, Engine& engine,
                         Metrics& metrics, CacheGauges& cache_gauges, const Authenticator& auth);

  grpc::ServerUnaryReactor* GetConfig(grpc::CallbackServerContext* ctx, const v1::GetConfigRequest* request,
                                      v1::GetConfigResponse* response) override;
  grpc::ServerUnaryReactor* CreateSequence(grpc::CallbackServerContext* ctx, const v1::CreateSequenceRequest* request,
                                           v1::CreateSequenceResponse* response) override;
  grpc::ServerUnaryReactor* AppendKV(grpc::CallbackServerContext* ctx, const v1::AppendKVRequest* request,
                                     v1::AppendKVResponse* response) override;
  grpc::ServerUnaryReactor* Decode(grpc::CallbackServerContext* ctx, const v1::DecodeRequest* request,
                                   v1::DecodeResponse* response) override;
  grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer>* DecodeStream(grpc::CallbackServerContext* ctx) override;
  grpc::ServerUnaryReactor* ForkSequence(grpc::CallbackServerContext* ctx, const v1::ForkSequenceRequest* request,
                                         v1::ForkSequenceResponse* response) override;
  grpc::ServerUnaryReactor* FreeSequence(grpc::CallbackServerContext* ctx, const v1::FreeSequenceRequest* request,
                                         v1::FreeSequenceResponse* response) override;
  grpc::ServerUnaryReactor* GetSequence(grpc::CallbackServerContext* ctx, const v1::GetSequenceRequest* request,
                                        v1::GetSequenceResponse* response) override;
  grpc::ServerUnaryReactor* TruncateSequence(grpc::CallbackServerContext* ctx,
                                             const v1::TruncateSequenceRequest* request,
                                             v1::TruncateSequenceResponse* response) override;

  // Drain: new calls get UNAVAILABLE; open streams answer what they have read,
  // then finish with UNAVAILABLE.
  void begin_drain();
  bool draining() const { return draining_.load(std::memory_order_acquire); }
  // Decode, AppendKV and DecodeStream calls started and not yet done (the
  // others answer within their handler).
  int64_t active_calls() const { return active_calls_.load(std::memory_order_acquire); }
  void call_started() { active_calls_.fetch_add(1, std::memory_order_acq_rel); }
  // Calls refused with UNAVAILABLE since the drain began (the drain listens on
  // until they stop arriving).
  int64_t refused_while_draining() const { return refused_while_draining_.load(std::memory_order_acquire); }
  void call_done() { active_calls_.fetch_sub(1, std::memory_order_acq_rel); }

  const ServiceSettings& settings() const { return settings_; }
  // RESOURCE_EXHAUSTED past --max-message-bytes (the transport takes more, so
  // that a DecodeStream can answer an oversized message on its own).
  Status check_message_size(const google::protobuf::Message& request) const;
  // INVALID_ARGUMENT when a K/V value to append is outside the cache dtype's
  // range once divided by `layer`'s scale (rpc/cache_range.h).
  Status check_kv_range(const void* k, const void* v, DType wire, int64_t rows, int32_t layer) const;
  CacheManager& cache() { return cache_; }
  Engine& engine() { return engine_; }
  const Authenticator& auth() const { return auth_; }

  // The calling tenant from the call's `authorization` metadata, or
  // UNAUTHENTICATED (counted by reason; the token is never logged).
  StatusOr<TenantId> tenant_of(const grpc::CallbackServerContext& ctx);
  // The same for an `authorization` value kept by an open stream (nullopt: none sent).
  StatusOr<TenantId> tenant_for(std::optional<std::string_view> header);
  // The call's `authorization` metadata, nullopt when it sent none.
  static std::optional<std::string> authorization_of(const grpc::CallbackServerContext& ctx);

  // One finished call (a DecodeStream response counts as one): its duration since
  // `received` by method and code, and an error line when it failed. `what` names
  // the request (e.g. "request_id=7 layer=0") for the log.
  void observe_call(RpcMethod method, EngineClock::time_point received, const Status& status,
                    std::string_view what = {});

  // Answers a call that needs no engine work, observed as above.
  grpc::ServerUnaryReactor* finish_unary(grpc::CallbackServerContext* ctx, RpcMethod method,
                                         EngineClock::time_point received, const Status& status,
                                         std::string_view what = {});

 private:
  friend class DecodeStreamCall;
  void register_stream(DecodeStreamCall* call);
  void unregister_stream(DecodeStreamCall* call);

  const ServiceSettings settings_;
  Backend& backend_;
  CacheManager& cache_;
  Engine& engine_;
  Metrics& metrics_;
  CacheGauges& cache_gauges_;
  const Authenticator& auth_;
  std::atomic<bool> draining_{false};
  std::atomic<int64_t> active_calls_{0};
  std::atomic<int64_t> refused_while_draining_{0};
  // Failed authentications: logged at most 5 a second (the metric counts every one).
  LogRateLimit auth_failure_log_{5, std::chrono::seconds(1)};
  std::mutex streams_mu_;
  std::unordered_set<DecodeStreamCall*> streams_;
};

// The status every call gets while the server drains.
Status draining_status();

}  // namespace pagoda
