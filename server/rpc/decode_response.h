#pragma once
// The DecodeResponse side of a Decode: its output buffers sized up front so the
// engine writes results straight into them, and the fields filled after.

#include "engine/work.h"
#include "pagoda/paged_kv.h"
#include "pagoda/split_plan.h"
#include "pagoda/v1/decode_attention.pb.h"

namespace pagoda {

// Sizes output (dtype of q) and lse (when asked) for the query rows, lengths
// and splits for the sequences of the request `work` was decoded from, and
// points work's outputs at them. An output or LSE whose request names a
// shared-memory range goes there instead (`out` / `lse` non-null: the range,
// checked by admission): the response then carries its shape, dtype and ref.
void prepare_response(const v1::DecodeRequest& request, const CacheGeometry& g, DecodeWork& work,
                      v1::DecodeResponse& response, std::byte* out = nullptr, std::byte* lse = nullptr);

// Copies what the engine reported into the response (after a successful decode).
void finish_response(const DecodeWork& work, SplitMode mode, double total_us, v1::DecodeResponse& response);

// A wire DType from a pagoda one (the enums share their numbers).
inline v1::DType to_wire(DType t) { return static_cast<v1::DType>(static_cast<int>(t)); }

}  // namespace pagoda
