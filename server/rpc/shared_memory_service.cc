// The shared-memory handlers of pagoda.v1.DecodeAttention (docs/design.md §15):
// bookkeeping only, answered in the handler. The regions are the caller's
// tenant's (shm/shared_memory_registry.h).
#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "rpc/service.h"

namespace pagoda {

grpc::ServerUnaryReactor* DecodeAttentionService::RegisterSharedMemory(grpc::CallbackServerContext* ctx,
                                                                       const v1::RegisterSharedMemoryRequest* request,
                                                                       v1::RegisterSharedMemoryResponse*) {
  const auto t0 = EngineClock::now();
  StatusOr<TenantId> tenant = admit_call(*ctx);
  if (!tenant.ok()) return finish_unary(ctx, RpcMethod::kRegisterSharedMemory, t0, tenant.status());
  const Status status =
      shm_.add(*tenant, request->name(), request->key(), request->offset(), request->byte_size());
  const std::string what = fmt::format("name='{}' key='{}'", request->name(), request->key());
  if (status.ok()) {
    spdlog::info("RegisterSharedMemory {} offset={} byte_size={}", what, request->offset(), request->byte_size());
  }
  return finish_unary(ctx, RpcMethod::kRegisterSharedMemory, t0, status, status.ok() ? "" : what);
}

grpc::ServerUnaryReactor* DecodeAttentionService::UnregisterSharedMemory(
    grpc::CallbackServerContext* ctx, const v1::UnregisterSharedMemoryRequest* request,
    v1::UnregisterSharedMemoryResponse*) {
  const auto t0 = EngineClock::now();
  StatusOr<TenantId> tenant = admit_call(*ctx);
  if (!tenant.ok()) return finish_unary(ctx, RpcMethod::kUnregisterSharedMemory, t0, tenant.status());
  const Status status = shm_.remove(*tenant, request->name());
  return finish_unary(ctx, RpcMethod::kUnregisterSharedMemory, t0, status,
                      status.ok() ? "" : fmt::format("name='{}'", request->name()));
}

grpc::ServerUnaryReactor* DecodeAttentionService::GetSharedMemoryStatus(grpc::CallbackServerContext* ctx,
                                                                        const v1::GetSharedMemoryStatusRequest* request,
                                                                        v1::GetSharedMemoryStatusResponse* response) {
  const auto t0 = EngineClock::now();
  StatusOr<TenantId> tenant = admit_call(*ctx);
  if (!tenant.ok()) return finish_unary(ctx, RpcMethod::kGetSharedMemoryStatus, t0, tenant.status());
  auto regions = shm_.status(*tenant, request->name());
  if (!regions.ok()) {
    return finish_unary(ctx, RpcMethod::kGetSharedMemoryStatus, t0, regions.status(),
                        fmt::format("name='{}'", request->name()));
  }
  for (const auto& r : *regions) {
    v1::SharedMemoryRegionStatus& s = *response->add_regions();
    s.set_name(r->name());
    s.set_key(r->key());
    s.set_offset(r->offset());
    s.set_byte_size(r->byte_size());
  }
  return finish_unary(ctx, RpcMethod::kGetSharedMemoryStatus, t0, Status::Ok());
}

}  // namespace pagoda
