// libFuzzer target: a request's bytes, as each unary RPC's handler takes them.
// The first byte picks the message type; the rest is parsed and, when it
// parses, validated by request_decoding.h and its response buffers sized.
// Nothing may crash, read out of bounds or overflow; a valid request's
// outputs must be sized by its rows.
#include <cstddef>
#include <cstdint>
#include <cstdlib>

#include "fuzz_geometry.h"
#include "rpc/decode_response.h"
#include "rpc/request_decoding.h"

namespace {

void fuzz_decode(const uint8_t* data, size_t size) {
  pagoda::v1::DecodeRequest request;
  if (!request.ParseFromArray(data, static_cast<int>(size))) return;
  const pagoda::CacheGeometry g = pagoda::fuzz::fuzz_geometry();
  pagoda::DecodeWork work;
  if (!pagoda::decode_request(request, g, pagoda::fuzz::kFuzzMaxBatch, work).ok()) return;
  pagoda::v1::DecodeResponse response;
  pagoda::prepare_response(request, g, work, response);
  const auto want = static_cast<size_t>(work.rows) * g.num_q_heads * g.head_dim * pagoda::dtype_size(work.q_dtype);
  if (response.output().data().size() != want) std::abort();
}

void fuzz_append(const uint8_t* data, size_t size) {
  pagoda::v1::AppendKVRequest request;
  if (!request.ParseFromArray(data, static_cast<int>(size))) return;
  pagoda::AppendWork work;
  (void)pagoda::decode_request(request, pagoda::fuzz::fuzz_geometry(), work);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  switch (data[0] % 2) {
    case 0: fuzz_decode(data + 1, size - 1); break;
    default: fuzz_append(data + 1, size - 1); break;
  }
  return 0;
}
