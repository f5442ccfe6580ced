// libFuzzer target: a DecodeStream's messages, read as decode_stream.cc reads
// them. The input is a run of messages, each a 2-byte little-endian length and
// that many bytes. A message that does not parse must end the stream with
// INVALID_ARGUMENT naming its place; one past the size limit is answered
// alone; the others are validated as a Decode is.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>

#include <fmt/format.h>

#include "fuzz_geometry.h"
#include "rpc/admission.h"
#include "rpc/stream_framing.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  constexpr int64_t kMaxBytes = 4096;
  const pagoda::ServiceSettings settings = pagoda::fuzz::fuzz_settings();
  size_t at = 0;
  for (int64_t index = 1; at + 2 <= size; ++index) {
    const size_t n = std::min<size_t>(size - at - 2, data[at] | (static_cast<size_t>(data[at + 1]) << 8));
    grpc::Slice slice(data + at + 2, n);
    grpc::ByteBuffer raw(&slice, 1);
    at += 2 + n;
    pagoda::v1::DecodeRequest request;
    const pagoda::Status framed = pagoda::read_stream_message(index, raw, kMaxBytes, request);
    if (framed.code() == pagoda::StatusCode::kInvalidArgument) {
      if (framed.message().rfind(fmt::format("DecodeStream message {}: ", index), 0) != 0) std::abort();
      return 0;  // the stream ends here
    }
    if (!framed.ok()) {
      if (framed.code() != pagoda::StatusCode::kResourceExhausted || static_cast<int64_t>(n) <= kMaxBytes) std::abort();
      continue;
    }
    pagoda::DecodeWork work;
    pagoda::v1::DecodeResponse response;
    (void)pagoda::admit_decode(request, static_cast<int64_t>(n), settings, work, response);
  }
  return 0;
}
