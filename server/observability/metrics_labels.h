#pragma once
// The closed label sets of pagoda's metrics (RPC methods, gRPC status codes, decode
// stages, split modes) and the histogram bucket layouts. Closed sets let the metrics
// resolve every label child up front instead of looking families up per call.

#include <array>
#include <cstddef>
#include <cstdint>
#include <string_view>
#include <vector>

#include "pagoda/split_plan.h"
#include "pagoda/status.h"

namespace pagoda {

// The methods of service pagoda.v1.DecodeAttention (docs/design.md §5).
enum class RpcMethod : uint8_t {
  kGetConfig,
  kCreateSequence,
  kAppendKV,
  kDecode,
  kDecodeStream,
  kForkSequence,
  kFreeSequence,
  kGetSequence,
  kTruncateSequence,
  kRegisterSharedMemory,
  kUnregisterSharedMemory,
  kGetSharedMemoryStatus,
  kExportSequence,
  kImportSequence,
};
inline constexpr std::size_t kNumRpcMethods = 14;

// Stages of one Decode call's path; a stage that costs nothing is not observed.
enum class DecodeStage : uint8_t {
  kQueue,      // enqueue to the start of the batch's launch
  kAppend,     // writing the new K/V into their slots
  kAttention,  // partial (split-KV) attention computation
  kMerge,      // merging the partial states
  kTransfer,   // host<->device copies (GPU backend only)
};
inline constexpr std::size_t kNumDecodeStages = 5;

inline constexpr std::size_t kNumSplitModes = 2;

// gRPC status codes are 0..16 (pagoda/status.h); a value outside is reported as UNKNOWN.
inline constexpr std::size_t kNumGrpcCodes = kStatusCodeNames.size();
inline constexpr int kGrpcUnknown = static_cast<int>(StatusCode::kUnknown);

// "Decode", "AppendKV", ... as the proto names them.
std::string_view rpc_method_name(RpcMethod method);
// "OK", "INVALID_ARGUMENT", ... (grpc::StatusCode's canonical names).
std::string_view grpc_code_name(int code);
// "queue", "append", "attention", "merge", "transfer".
std::string_view decode_stage_name(DecodeStage stage);
// "deterministic" or "fast".
std::string_view split_mode_name(SplitMode mode);

// Index of `code` in [0, kNumGrpcCodes), UNKNOWN for anything outside.
inline std::size_t grpc_code_index(int code) {
  return code >= 0 && code < static_cast<int>(kNumGrpcCodes) ? static_cast<std::size_t>(code)
                                                             : static_cast<std::size_t>(kGrpcUnknown);
}

// Latency buckets, 10 µs to 1 s in 1-2.5-5 steps: per-layer calls live in microseconds.
std::vector<double> latency_buckets_seconds();
// Batch sizes 1, 2, 4, ... 1024 (the default --max-batch is 256).
std::vector<double> batch_size_buckets();
// Tokens attended per sequence, 16 to 1 Mi in powers of two.
std::vector<double> context_tokens_buckets();

}  // namespace pagoda
