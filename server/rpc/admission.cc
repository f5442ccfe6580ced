#include "rpc/admission.h"

#include "rpc/decode_response.h"
#include "rpc/request_decoding.h"

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

}  // namespace

Status admit_decode(const v1::DecodeRequest& request, int64_t wire_bytes, const ServiceSettings& settings,
                    DecodeWork& work, v1::DecodeResponse& response) {
  PAGODA_RETURN_IF_ERROR(check_message_size(wire_bytes, settings));
  PAGODA_RETURN_IF_ERROR(decode_request(request, settings.geometry, settings.max_batch, work));
  if (work.k != nullptr) PAGODA_RETURN_IF_ERROR(check_request_tokens("k", work.rows, settings));
  prepare_response(request, settings.geometry, work, response);
  return Status::Ok();
}

Status admit_append(const v1::AppendKVRequest& request, int64_t wire_bytes, const ServiceSettings& settings,
                    AppendWork& work) {
  PAGODA_RETURN_IF_ERROR(check_message_size(wire_bytes, settings));
  PAGODA_RETURN_IF_ERROR(decode_request(request, settings.geometry, work));
  return check_request_tokens("k", work.num_tokens, settings);
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
