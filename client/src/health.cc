// grpc.health.v1.Health/Check without generated stubs: the two messages are one
// field each, so they are encoded by hand and sent through gRPC's generic stub.
// (Linking a second generated copy of a proto that libgrpc++ may already
// register is how clients abort at start-up; this avoids the question.)
#include <future>

#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/support/byte_buffer.h>

#include "client_impl.h"
#include "pagoda/client/grpc_error.h"
#include "health_wire.h"

namespace pagoda::client {

const char* serving_status_name(ServingStatus s) {
  switch (s) {
    case ServingStatus::kUnknown: return "UNKNOWN";
    case ServingStatus::kServing: return "SERVING";
    case ServingStatus::kNotServing: return "NOT_SERVING";
    case ServingStatus::kServiceUnknown: return "SERVICE_UNKNOWN";
  }
  return "UNKNOWN";
}

Result<ServingStatus> Client::health(const std::string& service) {
  const std::string request = health_wire::encode_check_request(service);
  grpc::Slice slice(request);
  grpc::ByteBuffer request_buffer(&slice, 1);
  grpc::ByteBuffer response_buffer;
  grpc::ClientContext ctx;
  impl_->prepare(ctx);

  grpc::GenericStub stub(impl_->channel);
  std::promise<grpc::Status> done;
  stub.UnaryCall(&ctx, "/grpc.health.v1.Health/Check", grpc::StubOptions(), &request_buffer,
                 &response_buffer, [&done](grpc::Status st) { done.set_value(std::move(st)); });
  const grpc::Status st = done.get_future().get();
  if (!st.ok()) return error_from_grpc(st, "Health/Check");

  std::vector<grpc::Slice> slices;
  if (!response_buffer.Dump(&slices).ok())
    return Error(ErrorCode::kInternal, "could not read the response bytes", "Health/Check");
  std::string bytes;
  for (const grpc::Slice& s : slices) bytes.append(reinterpret_cast<const char*>(s.begin()), s.size());
  const auto status = health_wire::decode_check_response(bytes);
  if (!status) return Error(ErrorCode::kInternal, "malformed HealthCheckResponse", "Health/Check");
  return static_cast<ServingStatus>(*status);
}

}  // namespace pagoda::client
