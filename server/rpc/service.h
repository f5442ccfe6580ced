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
#include "observability/log_rate_limit.h"
#include "observability/metrics.h"
#include "pagoda/backend.h"
#include "pagoda/v1/decode_attention.grpc.pb.h"
#include "rpc/request_decoding.h"
#include "rpc/service_settings.h"
#include "shm/shared_memory_registry.h"

namespace pagoda {

class DecodeStreamCall;


// Every method typed on the callback API but DecodeStream, which reads and
// writes raw bytes and parses each message itself (decode_stream.cc says why).
using DecodeAttentionBase = v1::DecodeAttention::WithCallbackMethod_GetConfig<
    v1::DecodeAttention::WithCallbackMethod_CreateSequence<v1::DecodeAttention::WithCallbackMethod_AppendKV<
        v1::DecodeAttention::WithCallbackMethod_Decode<v1::DecodeAttention::WithRawCallbackMethod_DecodeStream<
            v1::DecodeAttention::WithCallbackMethod_ForkSequence<v1::DecodeAttention::WithCallbackMethod_FreeSequence<
                v1::DecodeAttention::WithCallbackMethod_GetSequence<
                    v1::DecodeAttention::WithCallbackMethod_TruncateSequence<
                        v1::DecodeAttention::WithCallbackMethod_RegisterSharedMemory<
                            v1::DecodeAttention::WithCallbackMethod_UnregisterSharedMemory<
                                v1::DecodeAttention::WithCallbackMethod_GetSharedMemoryStatus<
                                    v1::DecodeAttention::WithCallbackMethod_ExportSequence<
                                        v1::DecodeAttention::WithCallbackMethod_ImportSequence<
                                            v1::DecodeAttention::Service>>>>>>>>>>>>>>;

class DecodeAttentionService final : public DecodeAttentionBase {
 public:
  // `auth` decides each call's tenant (off: every call is the default tenant).
  DecodeAttentionService(const ServiceSettings& settings, Backend& backend, CacheManager& cache, Engine& engine,
                         Metrics& metrics, const Authenticator& auth, SharedMemoryRegistry& shm);

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
  // Shared-memory regions (shared_memory_service.cc).
  grpc::ServerUnaryReactor* RegisterSharedMemory(grpc::CallbackServerContext* ctx,
                                                 const v1::RegisterSharedMemoryRequest* request,
                                                 v1::RegisterSharedMemoryResponse* response) override;
  grpc::ServerUnaryReactor* UnregisterSharedMemory(grpc::CallbackServerContext* ctx,
                                                   const v1::UnregisterSharedMemoryRequest* request,
                                                   v1::UnregisterSharedMemoryResponse* response) override;
  grpc::ServerUnaryReactor* GetSharedMemoryStatus(grpc::CallbackServerContext* ctx,
                                                  const v1::GetSharedMemoryStatusRequest* request,
                                                  v1::GetSharedMemoryStatusResponse* response) override;
  // sequence_transfer.cc: the export format's two ends (docs/design.md §13).
  grpc::ServerWriteReactor<v1::SequenceChunk>* ExportSequence(grpc::CallbackServerContext* ctx,
                                                              const v1::ExportSequenceRequest* request) override;
  grpc::ServerReadReactor<v1::SequenceChunk>* ImportSequence(grpc::CallbackServerContext* ctx,
                                                             v1::ImportSequenceResponse* response) override;

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
  CacheManager& cache() { return cache_; }
  Backend& backend() { return backend_; }
  // A stream for an export's reads or an import's writes: an idle one, or a
  // new one (CUDA: RESOURCE_EXHAUSTED when the device has no room). Give it
  // back when done so the next call reuses it.
  StatusOr<std::unique_ptr<BackendStream>> take_transfer_stream();
  void give_back_transfer_stream(std::unique_ptr<BackendStream> stream);
  Engine& engine() { return engine_; }
  const Authenticator& auth() const { return auth_; }
  // Where a call of `tenant`'s tensors may lie (its shared-memory regions).
  TensorSources sources_of(TenantId tenant) const { return {tenant, &shm_}; }

  // The calling tenant from the call's `authorization` metadata, or
  // UNAUTHENTICATED (counted by reason; the token is never logged).
  StatusOr<TenantId> tenant_of(const grpc::CallbackServerContext& ctx);
  // What every handler asks first: UNAVAILABLE while draining, else the tenant.
  StatusOr<TenantId> admit_call(const grpc::CallbackServerContext& ctx);
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
  const Authenticator& auth_;
  SharedMemoryRegistry& shm_;
  std::atomic<bool> draining_{false};
  std::atomic<int64_t> active_calls_{0};
  std::atomic<int64_t> refused_while_draining_{0};
  // Failed authentications: logged at most 5 a second (the metric counts every one).
  LogRateLimit auth_failure_log_{5, std::chrono::seconds(1)};
  std::mutex streams_mu_;
  std::unordered_set<DecodeStreamCall*> streams_;
  std::mutex transfer_mu_;
  std::vector<std::unique_ptr<BackendStream>> transfer_streams_;  // idle, under transfer_mu_
};

// The status every call gets while the server drains.
Status draining_status();

}  // namespace pagoda
