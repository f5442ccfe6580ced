#include "pagoda/client/error.h"

#include <array>

#include <fmt/format.h>

namespace pagoda::client {

std::string error_code_name(int code) {
  static constexpr std::array<std::string_view, 17> kNames = {
      "OK",          "CANCELLED",         "UNKNOWN",           "INVALID_ARGUMENT",
      "DEADLINE_EXCEEDED", "NOT_FOUND",   "ALREADY_EXISTS",    "PERMISSION_DENIED",
      "RESOURCE_EXHAUSTED", "FAILED_PRECONDITION", "ABORTED",  "OUT_OF_RANGE",
      "UNIMPLEMENTED", "INTERNAL",        "UNAVAILABLE",       "DATA_LOSS",
      "UNAUTHENTICATED"};
  if (code >= 0 && code < static_cast<int>(kNames.size())) return std::string(kNames[code]);
  return fmt::format("CODE_{}", code);
}

std::string Error::to_string() const {
  const std::string head = method_.empty() ? "" : method_ + ": ";
  return fmt::format("{}{} ({}): {}", head, code_name(), code_number(), message_);
}

Error invalid_argument(std::string message) {
  return Error(ErrorCode::kInvalidArgument, std::move(message), "client");
}

}  // namespace pagoda::client
