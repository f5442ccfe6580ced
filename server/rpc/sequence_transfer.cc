// ExportSequence and ImportSequence (docs/design.md §13): a write reactor sending a
// pinned cut chunk by chunk, and a read reactor gathering and checking chunks
// before one all-or-nothing import. The format is transfer/chunk_format.h's.
#include <mutex>
#include <optional>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "rpc/grpc_status.h"
#include "rpc/service.h"
#include "transfer/chunk_format.h"

namespace pagoda {
namespace {

// Sends chunk i while chunk i + 1 is read out of the cache, so the copy out
// of the pool and the transport overlap.
class ExportCall final : public grpc::ServerWriteReactor<v1::SequenceChunk> {
 public:
  ExportCall(DecodeAttentionService& service, grpc::CallbackServerContext& ctx,
             const v1::ExportSequenceRequest& request)
      : service_(service), sequence_id_(request.sequence_id()) {
    service.call_started();
    const Status status = start(ctx, request);
    if (!status.ok()) {
      finish(status);
      return;
    }
    chunks_->header(&chunk_[0]);
    has_next_ = true;
    next_ = 0;
    std::optional<Status> done;
    {
      std::lock_guard lock(mu_);
      done = send();
    }
    if (done) finish(*done);
  }

  void OnWriteDone(bool ok) override {
    std::optional<Status> done;
    if (!ok) {
      done = Status(StatusCode::kCancelled, "export: the client stopped reading");
    } else {
      std::lock_guard lock(mu_);
      done = send();
    }
    if (done) finish(*done);
  }

  void OnDone() override {
    cut_.release();
    if (stream_) service_.give_back_transfer_stream(std::move(stream_));
    service_.call_done();
    delete this;
  }

 private:
  Status start(grpc::CallbackServerContext& ctx, const v1::ExportSequenceRequest& request) {
    if (service_.draining()) return draining_status();
    StatusOr<TenantId> tenant = service_.tenant_of(ctx);
    PAGODA_RETURN_IF_ERROR(tenant.status());
    PAGODA_RETURN_IF_ERROR(service_.cache().cut(request.sequence_id(), *tenant, cut_));
    const std::vector<int32_t> from(request.from_lengths().begin(), request.from_lengths().end());
    StatusOr<ExportChunks> chunks =
        ExportChunks::create(cut_, from, service_.backend(), service_.settings().max_message_bytes);
    PAGODA_RETURN_IF_ERROR(chunks.status());
    chunks_.emplace(std::move(*chunks));
    StatusOr<std::unique_ptr<BackendStream>> stream = service_.take_transfer_stream();
    PAGODA_RETURN_IF_ERROR(stream.status());
    stream_ = std::move(*stream);
    return Status::Ok();
  }

  // Writes the prepared chunk and prepares the one after it, under mu_ (the
  // write may complete, and OnWriteDone run, before the preparing is done).
  // Returns the status to finish with when no chunk is left.
  std::optional<Status> send() {
    if (!has_next_) return error_;
    const int sending = next_;
    StartWrite(&chunk_[sending]);
    next_ = 1 - sending;
    StatusOr<bool> more = chunks_->next(*stream_, &chunk_[next_]);
    has_next_ = more.ok() && *more;
    if (!more.ok()) error_ = more.status();
    return std::nullopt;
  }

  void finish(const Status& status) {
    service_.observe_call(RpcMethod::kExportSequence, received_, status,
                          status.ok() ? std::string() : fmt::format("sequence_id={}", sequence_id_));
    Finish(to_grpc_status(status));
  }

  const EngineClock::time_point received_ = EngineClock::now();
  DecodeAttentionService& service_;
  const SequenceId sequence_id_;
  SequenceCut cut_;
  std::optional<ExportChunks> chunks_;
  std::unique_ptr<BackendStream> stream_;
  std::mutex mu_;
  v1::SequenceChunk chunk_[2];
  int next_ = 0;
  bool has_next_ = false;
  Status error_;
};

// Reads every chunk (each checked as it comes), then imports them at once.
class ImportCall final : public grpc::ServerReadReactor<v1::SequenceChunk> {
 public:
  ImportCall(DecodeAttentionService& service, grpc::CallbackServerContext& ctx, v1::ImportSequenceResponse& response)
      : service_(service),
        response_(response),
        assembler_(service.backend(), service.settings().max_label_bytes, service.settings().max_sequence_tokens) {
    service.call_started();
    if (service.draining()) {
      finish(draining_status());
      return;
    }
    StatusOr<TenantId> tenant = service.tenant_of(ctx);
    if (!tenant.ok()) {
      finish(tenant.status());
      return;
    }
    tenant_ = *tenant;
    StartRead(&chunk_);
  }

  void OnReadDone(bool ok) override {
    if (ok) {
      const Status status = assembler_.add(chunk_);
      if (!status.ok()) {
        finish(status);
        return;
      }
      StartRead(&chunk_);
      return;
    }
    finish(import());
  }

  void OnDone() override {
    service_.call_done();
    delete this;
  }

 private:
  Status import() {
    PAGODA_RETURN_IF_ERROR(assembler_.finish());
    StatusOr<std::unique_ptr<BackendStream>> stream = service_.take_transfer_stream();
    PAGODA_RETURN_IF_ERROR(stream.status());
    std::vector<int32_t> lengths;
    const ImportRequest request = assembler_.request(tenant_);
    StatusOr<SequenceId> id = service_.cache().import_rows(**stream, request, &lengths);
    service_.give_back_transfer_stream(std::move(*stream));
    PAGODA_RETURN_IF_ERROR(id.status());
    response_.set_sequence_id(*id);
    response_.mutable_layer_lengths()->Add(lengths.begin(), lengths.end());
    spdlog::debug("ImportSequence sequence_id={} from source {} ({} bytes){}", *id,
                  assembler_.header().source_sequence_id(), assembler_.bytes(), request.into != 0 ? " (a stage)" : "");
    return Status::Ok();
  }

  void finish(const Status& status) {
    std::string what;
    if (!status.ok() && assembler_.has_header()) {
      what = fmt::format("source_sequence_id={} into_sequence_id={}", assembler_.header().source_sequence_id(),
                         assembler_.header().into_sequence_id());
    }
    service_.observe_call(RpcMethod::kImportSequence, received_, status, what);
    Finish(to_grpc_status(status));
  }

  const EngineClock::time_point received_ = EngineClock::now();
  DecodeAttentionService& service_;
  v1::ImportSequenceResponse& response_;
  ImportAssembler assembler_;
  TenantId tenant_ = kDefaultTenant;
  v1::SequenceChunk chunk_;
};

}  // namespace

StatusOr<std::unique_ptr<BackendStream>> DecodeAttentionService::take_transfer_stream() {
  {
    std::lock_guard lock(transfer_mu_);
    if (!transfer_streams_.empty()) {
      std::unique_ptr<BackendStream> s = std::move(transfer_streams_.back());
      transfer_streams_.pop_back();
      return s;
    }
  }
  return backend_.open_stream();
}

void DecodeAttentionService::give_back_transfer_stream(std::unique_ptr<BackendStream> stream) {
  std::lock_guard lock(transfer_mu_);
  transfer_streams_.push_back(std::move(stream));
}

grpc::ServerWriteReactor<v1::SequenceChunk>* DecodeAttentionService::ExportSequence(
    grpc::CallbackServerContext* ctx, const v1::ExportSequenceRequest* request) {
  return new ExportCall(*this, *ctx, *request);
}

grpc::ServerReadReactor<v1::SequenceChunk>* DecodeAttentionService::ImportSequence(
    grpc::CallbackServerContext* ctx, v1::ImportSequenceResponse* response) {
  return new ImportCall(*this, *ctx, *response);
}

}  // namespace pagoda
