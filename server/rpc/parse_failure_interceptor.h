#pragma once
// A unary request whose bytes do not parse: gRPC's callback API answers it
// UNIMPLEMENTED with no message, as if the method did not exist. This server
// interceptor notes the failed parse and turns that answer into
// INVALID_ARGUMENT naming the method and the message type, logged once per
// call. (DecodeStream parses its messages itself: decode_stream.cc.)

#include <grpcpp/support/server_interceptor.h>

namespace pagoda {

class ParseFailureInterceptorFactory final : public grpc::experimental::ServerInterceptorFactoryInterface {
 public:
  grpc::experimental::Interceptor* CreateServerInterceptor(grpc::experimental::ServerRpcInfo* info) override;
};

}  // namespace pagoda
