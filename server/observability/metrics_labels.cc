#include "observability/metrics_labels.h"

namespace pagoda {

std::string_view rpc_method_name(RpcMethod method) {
  switch (method) {
    case RpcMethod::kGetConfig: return "GetConfig";
    case RpcMethod::kCreateSequence: return "CreateSequence";
    case RpcMethod::kAppendKV: return "AppendKV";
    case RpcMethod::kDecode: return "Decode";
    case RpcMethod::kDecodeStream: return "DecodeStream";
    case RpcMethod::kForkSequence: return "ForkSequence";
    case RpcMethod::kFreeSequence: return "FreeSequence";
    case RpcMethod::kGetSequence: return "GetSequence";
    case RpcMethod::kTruncateSequence: return "TruncateSequence";
    case RpcMethod::kRegisterSharedMemory: return "RegisterSharedMemory";
    case RpcMethod::kUnregisterSharedMemory: return "UnregisterSharedMemory";
    case RpcMethod::kGetSharedMemoryStatus: return "GetSharedMemoryStatus";
    case RpcMethod::kExportSequence: return "ExportSequence";
    case RpcMethod::kImportSequence: return "ImportSequence";
  }
  return "Unknown";
}

std::string_view grpc_code_name(int code) { return status_code_name(static_cast<int>(grpc_code_index(code))); }

std::string_view decode_stage_name(DecodeStage stage) {
  switch (stage) {
    case DecodeStage::kQueue: return "queue";
    case DecodeStage::kAppend: return "append";
    case DecodeStage::kAttention: return "attention";
    case DecodeStage::kMerge: return "merge";
    case DecodeStage::kTransfer: return "transfer";
  }
  return "unknown";
}

std::string_view split_mode_name(SplitMode mode) {
  return mode == SplitMode::kFast ? "fast" : "deterministic";
}

std::vector<double> latency_buckets_seconds() {
  // Written out: a computed 10^k is not always the exact decimal the `le` label shows.
  return {10e-6, 25e-6, 50e-6, 100e-6, 250e-6, 500e-6, 1e-3, 2.5e-3,
          5e-3,  10e-3, 25e-3, 50e-3,  0.1,    0.25,   0.5,   1.0};
}

std::vector<double> batch_size_buckets() {
  std::vector<double> bounds;
  for (double b = 1; b <= 1024; b *= 2) bounds.push_back(b);
  return bounds;
}

std::vector<double> context_tokens_buckets() {
  std::vector<double> bounds;
  for (double t = 16; t <= 1048576; t *= 2) bounds.push_back(t);
  return bounds;
}

}  // namespace pagoda
