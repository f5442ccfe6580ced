#pragma once
// One DecodeStream message as read from the wire: parsed here, not by gRPC's
// typed reader, which reports a message that does not parse like the end of
// the stream (decode_stream.cc, docs/design.md §11).

#include <cstdint>

#include <grpcpp/support/byte_buffer.h>

#include "pagoda/status.h"
#include "pagoda/v1/decode_attention.pb.h"

namespace pagoda {

// What a stream does with message `index` (1-based) of `raw`'s bytes:
//  - INVALID_ARGUMENT "DecodeStream message N: cannot parse ...": end the
//    stream with it once every earlier request is answered;
//  - RESOURCE_EXHAUSTED: past `max_bytes`; answer this request alone with it
//    (the stream carries on; `request` holds what parsed, for its request_id);
//  - OK: `request` is ready for decode_request.
Status read_stream_message(int64_t index, grpc::ByteBuffer& raw, int64_t max_bytes, v1::DecodeRequest& request);

}  // namespace pagoda
