#include "pagoda/client/decode_stream.h"

#include <fmt/format.h>

#include "client_impl.h"
#include "pagoda/client/grpc_error.h"
#include "wire.h"

namespace pagoda::client {
namespace {

// The stream ended before answering: the server's final status says why.
Error closed_error(DecodeStream::Impl& impl) {
  const grpc::Status& st = impl.finish_once();
  if (!st.ok()) return error_from_grpc(st, "DecodeStream");
  return Error(ErrorCode::kUnavailable, "stream closed by the server with requests outstanding",
               "DecodeStream");
}

}  // namespace

DecodeStream::DecodeStream(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

DecodeStream::~DecodeStream() {
  if (!finished_) {
    // Abandoning a session with requests in flight: cancel rather than wait for them.
    if (!pending_.empty()) impl_->ctx->TryCancel();
    (void)finish();
  }
}

Result<uint64_t> DecodeStream::send(const DecodeArgs& args) {
  if (finished_ || impl_->writes_done)
    return Error(ErrorCode::kFailedPrecondition, "send after finish()", "DecodeStream");
  if (impl_->final_status) return closed_error(*impl_);
  DecodeArgs numbered = args;
  if (numbered.request_id == 0) numbered.request_id = next_id_++;
  auto req = wire::decode_request(numbered, impl_->config);
  if (!req.ok()) return req.error();
  if (!impl_->rw->Write(*req)) return closed_error(*impl_);
  pending_.push_back(numbered.request_id);
  impl_->rows.push_back(numbered.rows());
  return numbered.request_id;
}

Result<DecodeResult> DecodeStream::receive() {
  if (pending_.empty())
    return Error(ErrorCode::kFailedPrecondition, "receive with no request outstanding", "DecodeStream");
  v1::DecodeResponse resp;
  if (!impl_->rw->Read(&resp)) return closed_error(*impl_);
  const uint64_t want = pending_.front();
  const int64_t rows = impl_->rows.front();
  pending_.pop_front();
  impl_->rows.pop_front();
  if (resp.request_id() != want) {
    return Error(ErrorCode::kInternal,
                 fmt::format("request_id: expected {} (oldest outstanding), received {}", want,
                             resp.request_id()),
                 "DecodeStream");
  }
  if (resp.has_error() && resp.error().code() != 0) {
    return Error(static_cast<ErrorCode>(resp.error().code()), resp.error().message(), "DecodeStream");
  }
  return wire::decode_result(resp, impl_->config, rows);
}

Result<DecodeResult> DecodeStream::call(const DecodeArgs& args) {
  auto id = send(args);
  if (!id.ok()) return id.error();
  return receive();
}

Outcome DecodeStream::finish() {
  if (finished_) return Done{};
  if (!impl_->writes_done) {
    impl_->rw->WritesDone();
    impl_->writes_done = true;
  }
  // Drain what is still outstanding so that Finish() can return.
  v1::DecodeResponse resp;
  while (!pending_.empty() && !impl_->final_status && impl_->rw->Read(&resp)) {
    pending_.pop_front();
    impl_->rows.pop_front();
  }
  finished_ = true;
  pending_.clear();
  impl_->rows.clear();
  const grpc::Status& st = impl_->finish_once();
  if (!st.ok() && st.error_code() != grpc::StatusCode::CANCELLED) return error_from_grpc(st, "DecodeStream");
  return Done{};
}

}  // namespace pagoda::client
