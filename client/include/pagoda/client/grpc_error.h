#pragma once
// grpc::Status -> Error: one mapping for every call of the client library.

#include <string>

#include <grpcpp/support/status.h>

#include "pagoda/client/error.h"

namespace pagoda::client {

// The status's code and message, tagged with the RPC that returned it. An OK
// status maps to an Error with code kOk (callers test ok() first).
Error error_from_grpc(const grpc::Status& status, std::string method);

}  // namespace pagoda::client
