// Client::migrate: ExportSequence on this client's server piped into
// ImportSequence on the target's, in stages (docs/design.md §13).
#include <chrono>

#include <fmt/format.h>

#include "client_impl.h"
#include "pagoda/client/client.h"
#include "pagoda/client/grpc_error.h"

namespace pagoda::client {
namespace {

struct Stage {
  uint64_t sequence_id = 0;
  std::vector<int32_t> layer_lengths;  // the target's after the stage
  std::vector<int32_t> source_lengths; // the cut's
  int64_t bytes = 0;
};

// One export piped chunk by chunk into one import; `into` 0: a new sequence.
Result<Stage> run_stage(Client::Impl& source, Client::Impl& target, uint64_t sequence_id,
                        const std::vector<int32_t>& from, uint64_t into) {
  grpc::ClientContext export_ctx;
  source.authorize(export_ctx);  // no per-call deadline: a bulk stage takes as long as its bytes
  v1::ExportSequenceRequest request;
  request.set_sequence_id(sequence_id);
  request.mutable_from_lengths()->Add(from.begin(), from.end());
  auto reader = source.stub->ExportSequence(&export_ctx, request);

  grpc::ClientContext import_ctx;
  target.authorize(import_ctx);
  v1::ImportSequenceResponse response;
  auto writer = target.stub->ImportSequence(&import_ctx, &response);
  Stage stage;
  v1::SequenceChunk chunk;
  bool target_open = true;
  while (reader->Read(&chunk)) {
    if (chunk.has_header()) {
      chunk.mutable_header()->set_into_sequence_id(into);
      stage.source_lengths.assign(chunk.header().layer_lengths().begin(), chunk.header().layer_lengths().end());
    }
    stage.bytes += static_cast<int64_t>(chunk.data().size());
    if (!writer->Write(chunk)) {
      target_open = false;  // the target refused: its status says why
      export_ctx.TryCancel();
      break;
    }
  }
  const grpc::Status exported = reader->Finish();
  writer->WritesDone();
  const grpc::Status imported = writer->Finish();
  // A failed export ends the import early, which refuses it: the export's status is the cause.
  if (!exported.ok() && target_open) return error_from_grpc(exported, "ExportSequence");
  if (!imported.ok()) return error_from_grpc(imported, "ImportSequence");
  stage.sequence_id = response.sequence_id();
  stage.layer_lengths.assign(response.layer_lengths().begin(), response.layer_lengths().end());
  return stage;
}

int64_t tokens_left(const std::vector<int32_t>& have, const std::vector<int32_t>& at) {
  int64_t n = 0;
  for (size_t l = 0; l < have.size() && l < at.size(); ++l) n += have[l] - at[l];
  return n;
}

}  // namespace

Result<MigrateResult> Client::migrate(uint64_t sequence_id, Client& target, const MigrateOptions& options) {
  MigrateResult result;
  Result<Stage> bulk = run_stage(*impl_, *target.impl_, sequence_id, {}, 0);
  if (!bulk.ok()) return bulk.error();
  result.sequence_id = bulk->sequence_id;
  result.bytes = bulk->bytes;
  result.stages = 1;
  std::vector<int32_t> at = bulk->layer_lengths;
  auto fail = [&](const Error& e) -> Error {
    (void)target.free_sequence(result.sequence_id);  // the source stays as it was
    return e;
  };
  for (int32_t i = 0; i < options.max_catch_up_stages; ++i) {
    Result<SequenceInfo> info = get_sequence(sequence_id);
    if (!info.ok()) return fail(info.error());
    if (tokens_left(info->layer_lengths, at) <= options.last_stage_tokens) break;
    Result<Stage> stage = run_stage(*impl_, *target.impl_, sequence_id, at, result.sequence_id);
    if (!stage.ok()) return fail(stage.error());
    at = stage->layer_lengths;
    result.bytes += stage->bytes;
    ++result.stages;
  }
  const auto t0 = std::chrono::steady_clock::now();
  if (options.hold) options.hold();
  Result<Stage> last = run_stage(*impl_, *target.impl_, sequence_id, at, result.sequence_id);
  if (!last.ok()) return fail(last.error());
  result.bytes += last->bytes;
  ++result.stages;
  result.layer_lengths = last->layer_lengths;
  if (options.free_source) {
    // Nothing may have been appended since the last cut, or it would be lost.
    Result<SequenceInfo> info = get_sequence(sequence_id);
    if (!info.ok()) return fail(info.error());
    if (info->layer_lengths != last->source_lengths) {
      return fail(Error(ErrorCode::kFailedPrecondition,
                        fmt::format("sequence {}: expected no appends after the last stage (hold), its lengths "
                                    "changed; the source is kept",
                                    sequence_id),
                        "migrate"));
    }
    Outcome freed = free_sequence(sequence_id);
    if (!freed.ok()) return freed.error();
  }
  result.last_stage_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return result;
}

}  // namespace pagoda::client
