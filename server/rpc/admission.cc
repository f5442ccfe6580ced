#include "rpc/admission.h"

#include <cstdint>

#include "rpc/kv_values.h"
#include "rpc/decode_response.h"

namespace pagoda {
namespace {

// RESOURCE_EXHAUSTED past --max-message-bytes (the transport takes twice that,
// so the refusal can name the size).
Status check_message_size(int64_t bytes, const ServiceSettings& settings) {
  if (bytes <= settings.max_message_bytes) return Status::Ok();
  return ResourceExhausted("request: expected at most {} bytes (--max-message-bytes), received {}",
                           settings.max_message_bytes, bytes);
}

// INVALID_ARGUMENT naming `field` past --max-request-tokens.
Status check_request_tokens(const char* field, int64_t tokens, const ServiceSettings& settings) {
  if (tokens <= settings.max_request_tokens) return Status::Ok();
  return InvalidArgument("{}: expected at most {} tokens per request (--max-request-tokens), received {}", field,
                         settings.max_request_tokens, tokens);
}

// The range `ref` names for a result of `bytes` bytes (`field`: output_shm or
// lse_shm), `align`-aligned so that it can be written as its elements.
StatusOr<SharedMemorySpan> result_range(const char* field, const v1::SharedMemoryRef& ref, int64_t bytes,
                                        size_t align, const TensorSources& sources) {
  if (sources.shm == nullptr || !sources.shm->enabled()) {
    return Status(StatusCode::kFailedPrecondition,
                  fmt::format("{}: expected a server started with --allow-shared-memory, received a shared-memory "
                              "range",
                              field));
  }
  if (ref.byte_size() != bytes) {
    return InvalidArgument("{}.byte_size: expected {} bytes, received {}", field, bytes, ref.byte_size());
  }
  StatusOr<SharedMemorySpan> span = sources.shm->resolve(sources.tenant, field, ref.region(), ref.offset(), bytes);
  if (span.ok() && reinterpret_cast<uintptr_t>(span->data) % align != 0) {
    return InvalidArgument("{}.offset: expected a multiple of {} bytes, received {}", field, align, ref.offset());
  }
  return span;
}

}  // namespace

Status admit_decode(const v1::DecodeRequest& request, int64_t wire_bytes, const ServiceSettings& settings,
                    DecodeWork& work, v1::DecodeResponse& response, const TensorSources& sources) {
  PAGODA_RETURN_IF_ERROR(check_message_size(wire_bytes, settings));
  PAGODA_RETURN_IF_ERROR(decode_request(request, settings.geometry, settings.max_batch, work, sources));
  if (work.k != nullptr) {
    PAGODA_RETURN_IF_ERROR(check_request_tokens("k", work.rows, settings));
    PAGODA_RETURN_IF_ERROR(check_kv_values(work.k, work.v, work.kv_dtype, work.rows, settings.geometry,
                                           settings.kv_scale(work.layer)));
  }
  const CacheGeometry& g = settings.geometry;
  std::byte* out = nullptr;
  std::byte* lse = nullptr;
  const int64_t cells = static_cast<int64_t>(work.rows) * g.num_q_heads;
  if (request.has_output_shm()) {
    StatusOr<SharedMemorySpan> span = result_range(
        "output_shm", request.output_shm(), cells * g.v_dim() * static_cast<int64_t>(dtype_size(work.q_dtype)),
        dtype_size(work.q_dtype), sources);
    if (!span.ok()) return span.status();
    out = span->data;
    work.regions[3] = std::move(span->region);
  }
  if (request.has_lse_shm()) {
    if (!request.return_lse()) {
      return InvalidArgument("lse_shm: expected return_lse with it, received return_lse false");
    }
    StatusOr<SharedMemorySpan> span =
        result_range("lse_shm", request.lse_shm(), cells * static_cast<int64_t>(sizeof(float)), sizeof(float), sources);
    if (!span.ok()) return span.status();
    lse = span->data;
    work.regions[4] = std::move(span->region);
  }
  prepare_response(request, g, work, response, out, lse);
  return Status::Ok();
}

Status admit_append(const v1::AppendKVRequest& request, int64_t wire_bytes, const ServiceSettings& settings,
                    AppendWork& work, const TensorSources& sources) {
  PAGODA_RETURN_IF_ERROR(check_message_size(wire_bytes, settings));
  PAGODA_RETURN_IF_ERROR(decode_request(request, settings.geometry, work, sources));
  PAGODA_RETURN_IF_ERROR(check_request_tokens("k", work.num_tokens, settings));
  return check_kv_values(work.k, work.v, work.dtype, work.num_tokens, settings.geometry,
                         settings.kv_scale(work.layer));
}

Status admit_create(const v1::CreateSequenceRequest& request, const ServiceSettings& settings) {
  if (static_cast<int64_t>(request.label().size()) <= settings.max_label_bytes) return Status::Ok();
  return InvalidArgument("label: expected at most {} bytes (--max-label-bytes), received {}", settings.max_label_bytes,
                         request.label().size());
}

StatusOr<int32_t> admit_fork(const v1::ForkSequenceRequest& request) {
  const int32_t count = request.count() == 0 ? 1 : request.count();
  if (count < 1 || count > kMaxForkCount) {
    return InvalidArgument("count: expected 1 to {} forks (0 means 1), received {}", kMaxForkCount, request.count());
  }
  return count;
}

Status admit_truncate(const v1::TruncateSequenceRequest& request) {
  if (request.length() >= 0) return Status::Ok();
  return InvalidArgument("length: expected >= 0, received {}", request.length());
}

}  // namespace pagoda
