#include "rpc/stream_framing.h"

#include <grpcpp/support/proto_buffer_reader.h>

namespace pagoda {

Status read_stream_message(int64_t index, grpc::ByteBuffer& raw, int64_t max_bytes, v1::DecodeRequest& request) {
  const size_t bytes = raw.Length();
  grpc::ProtoBufferReader reader(&raw);
  if (!request.ParseFromZeroCopyStream(&reader)) {
    return InvalidArgument(
        "DecodeStream message {}: cannot parse its {} bytes as pagoda.v1.DecodeRequest; every earlier request was "
        "answered",
        index, bytes);
  }
  if (static_cast<int64_t>(bytes) > max_bytes) {
    return ResourceExhausted("request: expected at most {} bytes (--max-message-bytes), received {}", max_bytes,
                             bytes);
  }
  return Status::Ok();
}

}  // namespace pagoda
