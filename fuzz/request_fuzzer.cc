// libFuzzer target: a request's bytes, as each unary RPC's handler takes them.
// The first byte picks the message type; the rest is parsed and, when it
// parses, admitted as the handlers admit it (rpc/admission.h): validated and
// its response buffers sized.
// Nothing may crash, read out of bounds or overflow; a valid request's
// outputs must be sized by its rows.
#include <cstddef>
#include <cstdint>
#include <cstdlib>

#include "fuzz_geometry.h"
#include "rpc/admission.h"

namespace {

void fuzz_decode(const uint8_t* data, size_t size) {
  pagoda::v1::DecodeRequest request;
  if (!request.ParseFromArray(data, static_cast<int>(size))) return;
  const pagoda::ServiceSettings settings = pagoda::fuzz::fuzz_settings();
  const pagoda::CacheGeometry& g = settings.geometry;
  pagoda::DecodeWork work;
  pagoda::v1::DecodeResponse response;
  if (!pagoda::admit_decode(request, static_cast<int64_t>(size), settings, work, response).ok()) return;
  const auto want = static_cast<size_t>(work.rows) * g.num_q_heads * g.head_dim * pagoda::dtype_size(work.q_dtype);
  if (response.output().data().size() != want) std::abort();
}

void fuzz_append(const uint8_t* data, size_t size) {
  pagoda::v1::AppendKVRequest request;
  if (!request.ParseFromArray(data, static_cast<int>(size))) return;
  pagoda::AppendWork work;
  (void)pagoda::admit_append(request, static_cast<int64_t>(size), pagoda::fuzz::fuzz_settings(), work);
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
