#include "rpc/parse_failure_interceptor.h"

#include <chrono>
#include <string>

#include <fmt/format.h>
#include <google/protobuf/descriptor.h>
#include <spdlog/spdlog.h>

namespace pagoda {
namespace {

using grpc::experimental::InterceptionHookPoints;

// "/pagoda.v1.DecodeAttention/Decode" -> "pagoda.v1.DecodeRequest", or "" when unknown.
std::string request_type_of(const char* method) {
  std::string name = method;
  if (!name.empty() && name.front() == '/') name.erase(0, 1);
  const auto slash = name.find('/');
  if (slash != std::string::npos) name[slash] = '.';
  const auto* m = google::protobuf::DescriptorPool::generated_pool()->FindMethodByName(name);
  return m != nullptr ? m->input_type()->full_name() : std::string();
}

class ParseFailureInterceptor final : public grpc::experimental::Interceptor {
 public:
  explicit ParseFailureInterceptor(grpc::experimental::ServerRpcInfo* info) : info_(info) {}

  void Intercept(grpc::experimental::InterceptorBatchMethods* methods) override {
    if (methods->QueryInterceptionHookPoint(InterceptionHookPoints::POST_RECV_MESSAGE) &&
        methods->GetRecvMessage() == nullptr) {
      unparsed_ = true;
    }
    if (unparsed_ && methods->QueryInterceptionHookPoint(InterceptionHookPoints::PRE_SEND_STATUS)) {
      const grpc::Status sent = methods->GetSendStatus();
      if (sent.error_code() == grpc::StatusCode::UNIMPLEMENTED && sent.error_message().empty() && cut_short()) {
        // A valid request whose deadline passed (or that the client cancelled)
        // while it was still arriving: nothing wrong with its bytes.
        const std::string message =
            fmt::format("{}: the deadline passed while the request message was arriving", info_->method());
        spdlog::debug("{}", message);
        methods->ModifySendStatus(grpc::Status(grpc::StatusCode::DEADLINE_EXCEEDED, message));
      } else if (sent.error_code() == grpc::StatusCode::UNIMPLEMENTED && sent.error_message().empty()) {
        const std::string type = request_type_of(info_->method());
        const std::string message =
            fmt::format("{}: cannot parse the request message as {}", info_->method(), type.empty() ? "its type" : type);
        spdlog::warn("{}", message);
        methods->ModifySendStatus(grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, message));
      }
    }
    methods->Proceed();
  }

 private:
  // The read failed because the call ended first, not because of its bytes:
  // cancelled, or at its deadline. The client's clock runs ahead of the
  // server's deadline by the one-way latency, and its cancel (sent when its
  // own deadline passed) can arrive before the server's deadline or before
  // IsCancelled() says so; a margin covers that.
  bool cut_short() const {
    constexpr auto kMargin = std::chrono::milliseconds(100);
    grpc::ServerContextBase* ctx = info_->server_context();
    return ctx->IsCancelled() || std::chrono::system_clock::now() + kMargin >= ctx->deadline();
  }

  grpc::experimental::ServerRpcInfo* info_;
  bool unparsed_ = false;
};

}  // namespace

grpc::experimental::Interceptor* ParseFailureInterceptorFactory::CreateServerInterceptor(
    grpc::experimental::ServerRpcInfo* info) {
  // Unary calls only: a stream's failed read looks like its end.
  if (info->type() != grpc::experimental::ServerRpcInfo::Type::UNARY) return nullptr;
  return new ParseFailureInterceptor(info);
}

}  // namespace pagoda
