#pragma once
// What a failed client call says: the gRPC status code (number and name), the
// server's message, and which method failed. No exceptions: every call returns a
// Result<T>, a value or the Error that explains why there is none.

#include <string>
#include <string_view>
#include <utility>
#include <variant>

#include "pagoda/status.h"

namespace pagoda::client {

// gRPC status code numbers (grpc::StatusCode): the server's own vocabulary
// (pagoda/status.h), so that callers need no gRPC header to test for one.
using ErrorCode = pagoda::StatusCode;

// "INVALID_ARGUMENT" for 3 and so on; "CODE_<n>" for a number outside gRPC's set.
std::string error_code_name(int code);

class Error {
 public:
  Error() = default;
  Error(ErrorCode code, std::string message, std::string method = {})
      : code_(code), message_(std::move(message)), method_(std::move(method)) {}

  ErrorCode code() const { return code_; }
  int code_number() const { return static_cast<int>(code_); }
  std::string code_name() const { return error_code_name(code_number()); }
  const std::string& message() const { return message_; }
  // The RPC that failed, e.g. "Decode"; empty for a client-side check.
  const std::string& method() const { return method_; }
  // "Decode: INVALID_ARGUMENT (3): q.shape[1]: expected 8, received 4"
  std::string to_string() const;

 private:
  ErrorCode code_ = ErrorCode::kUnknown;
  std::string message_;
  std::string method_;
};

// A client-side argument check that failed before anything was sent.
Error invalid_argument(std::string message);

// A value or the Error that explains why there is none.
template <typename T>
class [[nodiscard]] Result {
 public:
  Result(T value) : v_(std::move(value)) {}   // NOLINT: implicit by design
  Result(Error error) : v_(std::move(error)) {}  // NOLINT: implicit by design

  bool ok() const { return std::holds_alternative<T>(v_); }
  explicit operator bool() const { return ok(); }
  const Error& error() const { return std::get<Error>(v_); }
  T& value() { return std::get<T>(v_); }
  const T& value() const { return std::get<T>(v_); }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }
  T& operator*() { return value(); }
  const T& operator*() const { return value(); }

 private:
  std::variant<T, Error> v_;
};

// For calls that return nothing but may fail.
struct Done {};
using Outcome = Result<Done>;

}  // namespace pagoda::client
