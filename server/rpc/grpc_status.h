#pragma once
// The one place pagoda::Status becomes grpc::Status (codes share gRPC's numbers).

#include <grpcpp/support/status.h>

#include "pagoda/status.h"

namespace pagoda {

grpc::Status to_grpc_status(const Status& status);

}  // namespace pagoda
