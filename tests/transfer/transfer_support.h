#pragma once
// Export and import over the generated stubs, for the transfer tests.

#include <grpcpp/grpcpp.h>

#include <cstdint>
#include <string>
#include <vector>

#include "pagoda/v1/decode_attention.grpc.pb.h"

namespace pagoda::e2e {

// Every chunk of an export (the call's status in *status).
std::vector<v1::SequenceChunk> export_chunks(v1::DecodeAttention::Stub& stub, uint64_t id,
                                             const std::vector<int32_t>& from_lengths, grpc::Status* status,
                                             const std::string& token = "");

// Sends `chunks` as one import.
grpc::Status import_chunks(v1::DecodeAttention::Stub& stub, const std::vector<v1::SequenceChunk>& chunks,
                           v1::ImportSequenceResponse* response, const std::string& token = "");

// The data bytes of every chunk after the header, concatenated.
std::string data_of(const std::vector<v1::SequenceChunk>& chunks);

}  // namespace pagoda::e2e
