#include "pagoda/client/grpc_error.h"

namespace pagoda::client {

Error error_from_grpc(const grpc::Status& status, std::string method) {
  std::string message = status.error_message();
  if (message.empty()) message = "(no message)";
  if (!status.error_details().empty()) message += " [details attached]";
  return Error(static_cast<ErrorCode>(status.error_code()), std::move(message), std::move(method));
}

}  // namespace pagoda::client
