#pragma once
// A unary request whose bytes do not parse: gRPC's callback API answers it
// UNIMPLEMENTED with no message, as if the method did not exist. This server
// interceptor notes the failed parse and turns that answer into
// INVALID_ARGUMENT naming the method and the message type, logged once per
// call. A read that failed because the deadline passed (or the client
// cancelled) while the message was arriving is DEADLINE_EXCEEDED instead, and
// logged at debug only: its bytes were fine. (DecodeStream parses its messages
// itself: decode_stream.cc.)

#include <grpcpp/server_context.h>
#include <grpcpp/support/server_interceptor.h>

namespace pagoda {

class ParseFailureInterceptorFactory final : public grpc::experimental::ServerInterceptorFactoryInterface {
 public:
  grpc::experimental::Interceptor* CreateServerInterceptor(grpc::experimental::ServerRpcInfo* info) override;
};

}  // namespace pagoda
