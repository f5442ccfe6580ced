#pragma once
// Conversions between the client's plain types and the pagoda.v1 messages.
// Internal to the client library: it is the only place that knows both.

#include <cstddef>
#include <initializer_list>
#include <span>

#include "pagoda/client/error.h"
#include "pagoda/client/types.h"
#include "pagoda/v1/decode_attention.pb.h"

namespace pagoda::client::wire {

ServerConfig config_from_proto(const v1::GetConfigResponse& m);

// Fills `t` with `values` as `dtype`, shape {dim0, dim1, dim2}.
void fill_tensor(v1::Tensor& t, std::span<const float> values, DType dtype,
                 std::initializer_list<int64_t> shape);

// Checks the arguments against the server's geometry and builds the request.
Result<v1::DecodeRequest> decode_request(const DecodeArgs& args, const ServerConfig& config);

// Reads a response for a request of `rows` query rows, converting the output
// from its wire dtype to fp32 and checking every size.
Result<DecodeResult> decode_result(const v1::DecodeResponse& m, const ServerConfig& config,
                                   int64_t rows);

}  // namespace pagoda::client::wire
