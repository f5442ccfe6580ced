#pragma once
// Admission: every check a request passes before it may change anything, one
// function per RPC family, called by the unary handlers, DecodeStream and the
// fuzzers alike. The engine, the cache manager and the backends take what
// these let through as given (debug assertions only). Every message names
// the field, the expected and the received value; a refused request has
// changed nothing.

#include <cstdint>

#include "engine/work.h"
#include "pagoda/status.h"
#include "pagoda/v1/decode_attention.pb.h"
#include "rpc/request_decoding.h"
#include "rpc/service_settings.h"

namespace pagoda {

// Most forks one ForkSequence makes (ForkSequenceRequest.count).
inline constexpr int32_t kMaxForkCount = 4096;

// Decode, and each DecodeStream request: its size as received (`wire_bytes`,
// RESOURCE_EXHAUSTED past --max-message-bytes), every field
// (request_decoding.h), the tokens it appends (--max-request-tokens) and their
// values (finite, within the cache's range: one pass, kv_values.h); then its
// response buffers are sized and `work`'s outputs pointed at them.
// Tensors may lie in the caller's shared-memory regions (`sources`), and the
// output and LSE go into them when output_shm / lse_shm name a range.
Status admit_decode(const v1::DecodeRequest& request, int64_t wire_bytes, const ServiceSettings& settings,
                    DecodeWork& work, v1::DecodeResponse& response, const TensorSources& sources = {});

// AppendKV: size, fields, tokens, values.
Status admit_append(const v1::AppendKVRequest& request, int64_t wire_bytes, const ServiceSettings& settings,
                    AppendWork& work, const TensorSources& sources = {});


// CreateSequence: the label's length (--max-label-bytes).
Status admit_create(const v1::CreateSequenceRequest& request, const ServiceSettings& settings);

// ForkSequence: the forks to make (count; 0 means 1).
StatusOr<int32_t> admit_fork(const v1::ForkSequenceRequest& request);

// TruncateSequence: a length >= 0.
Status admit_truncate(const v1::TruncateSequenceRequest& request);

}  // namespace pagoda
