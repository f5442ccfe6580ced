#pragma once
// Status values for every failure: no exceptions and no aborts on a request's
// path. Codes carry gRPC's numbers so that the service maps them one to one.

#include <array>
#include <string>
#include <string_view>
#include <utility>
#include <variant>

#include <fmt/format.h>

namespace pagoda {

// gRPC's codes, numbers and names (grpc::StatusCode): the one vocabulary the
// server, its metrics and the client share.
enum class StatusCode : int {
  kOk = 0,
  kCancelled = 1,
  kUnknown = 2,
  kInvalidArgument = 3,
  kDeadlineExceeded = 4,
  kNotFound = 5,
  kAlreadyExists = 6,
  kPermissionDenied = 7,
  kResourceExhausted = 8,
  kFailedPrecondition = 9,
  kAborted = 10,
  kOutOfRange = 11,
  kUnimplemented = 12,
  kInternal = 13,
  kUnavailable = 14,
  kDataLoss = 15,
  kUnauthenticated = 16,
};

inline constexpr std::array<std::string_view, 17> kStatusCodeNames = {
    "OK",        "CANCELLED",          "UNKNOWN",      "INVALID_ARGUMENT", "DEADLINE_EXCEEDED", "NOT_FOUND",
    "ALREADY_EXISTS", "PERMISSION_DENIED", "RESOURCE_EXHAUSTED", "FAILED_PRECONDITION", "ABORTED",
    "OUT_OF_RANGE", "UNIMPLEMENTED", "INTERNAL", "UNAVAILABLE", "DATA_LOSS", "UNAUTHENTICATED"};

// "INVALID_ARGUMENT" for 3; empty for a number outside gRPC's set.
constexpr std::string_view status_code_name(int code) {
  return code >= 0 && code < static_cast<int>(kStatusCodeNames.size()) ? kStatusCodeNames[static_cast<size_t>(code)]
                                                                        : std::string_view();
}

class [[nodiscard]] Status {
 public:
  Status() = default;
  Status(StatusCode code, std::string message) : code_(code), message_(std::move(message)) {}

  static Status Ok() { return {}; }
  bool ok() const { return code_ == StatusCode::kOk; }
  StatusCode code() const { return code_; }
  const std::string& message() const { return message_; }

 private:
  StatusCode code_ = StatusCode::kOk;
  std::string message_;
};

template <typename... Args>
Status InvalidArgument(fmt::format_string<Args...> f, Args&&... args) {
  return {StatusCode::kInvalidArgument, fmt::format(f, std::forward<Args>(args)...)};
}
template <typename... Args>
Status NotFound(fmt::format_string<Args...> f, Args&&... args) {
  return {StatusCode::kNotFound, fmt::format(f, std::forward<Args>(args)...)};
}
template <typename... Args>
Status ResourceExhausted(fmt::format_string<Args...> f, Args&&... args) {
  return {StatusCode::kResourceExhausted, fmt::format(f, std::forward<Args>(args)...)};
}
template <typename... Args>
Status Internal(fmt::format_string<Args...> f, Args&&... args) {
  return {StatusCode::kInternal, fmt::format(f, std::forward<Args>(args)...)};
}
template <typename... Args>
Status Unavailable(fmt::format_string<Args...> f, Args&&... args) {
  return {StatusCode::kUnavailable, fmt::format(f, std::forward<Args>(args)...)};
}

template <typename... Args>
Status FailedPrecondition(fmt::format_string<Args...> f, Args&&... args) {
  return {StatusCode::kFailedPrecondition, fmt::format(f, std::forward<Args>(args)...)};
}

template <typename... Args>
Status DataLoss(fmt::format_string<Args...> f, Args&&... args) {
  return {StatusCode::kDataLoss, fmt::format(f, std::forward<Args>(args)...)};
}

template <typename... Args>
Status Unauthenticated(fmt::format_string<Args...> f, Args&&... args) {
  return {StatusCode::kUnauthenticated, fmt::format(f, std::forward<Args>(args)...)};
}

// A value or the Status that explains why there is none.
template <typename T>
class [[nodiscard]] StatusOr {
 public:
  StatusOr(T value) : v_(std::move(value)) {}  // NOLINT: implicit by design
  StatusOr(Status status) : v_(std::move(status)) {}  // NOLINT: implicit by design

  bool ok() const { return std::holds_alternative<T>(v_); }
  const Status& status() const {
    static const Status kOk;
    return ok() ? kOk : std::get<Status>(v_);
  }
  T& value() { return std::get<T>(v_); }
  const T& value() const { return std::get<T>(v_); }
  T* operator->() { return &value(); }
  T& operator*() { return value(); }

 private:
  std::variant<T, Status> v_;
};

#define PAGODA_RETURN_IF_ERROR(expr)          \
  do {                                        \
    ::pagoda::Status pagoda_status_ = (expr); \
    if (!pagoda_status_.ok()) return pagoda_status_; \
  } while (0)

}  // namespace pagoda
