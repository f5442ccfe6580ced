#include "rpc/parse_failure_interceptor.h"

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
      if (sent.error_code() == grpc::StatusCode::UNIMPLEMENTED && sent.error_message().empty()) {
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
