#include "rpc/grpc_status.h"

namespace pagoda {

grpc::Status to_grpc_status(const Status& status) {
  if (status.ok()) return grpc::Status::OK;
  return {static_cast<grpc::StatusCode>(static_cast<int>(status.code())), status.message()};
}

}  // namespace pagoda
