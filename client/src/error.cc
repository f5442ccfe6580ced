#include "pagoda/client/error.h"

#include <array>

#include <fmt/format.h>

namespace pagoda::client {

std::string error_code_name(int code) {
  const std::string_view name = status_code_name(code);
  return name.empty() ? fmt::format("CODE_{}", code) : std::string(name);
}

std::string Error::to_string() const {
  const std::string head = method_.empty() ? "" : method_ + ": ";
  return fmt::format("{}{} ({}): {}", head, code_name(), code_number(), message_);
}

Error invalid_argument(std::string message) {
  return Error(ErrorCode::kInvalidArgument, std::move(message), "client");
}

}  // namespace pagoda::client
