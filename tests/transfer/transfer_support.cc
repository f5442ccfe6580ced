#include "transfer_support.h"

namespace pagoda::e2e {

std::vector<v1::SequenceChunk> export_chunks(v1::DecodeAttention::Stub& stub, uint64_t id,
                                             const std::vector<int32_t>& from_lengths, grpc::Status* status,
                                             const std::string& token) {
  grpc::ClientContext ctx;
  if (!token.empty()) ctx.AddMetadata("authorization", "Bearer " + token);
  v1::ExportSequenceRequest request;
  request.set_sequence_id(id);
  request.mutable_from_lengths()->Add(from_lengths.begin(), from_lengths.end());
  auto reader = stub.ExportSequence(&ctx, request);
  std::vector<v1::SequenceChunk> chunks;
  v1::SequenceChunk chunk;
  while (reader->Read(&chunk)) chunks.push_back(chunk);
  *status = reader->Finish();
  return chunks;
}

grpc::Status import_chunks(v1::DecodeAttention::Stub& stub, const std::vector<v1::SequenceChunk>& chunks,
                           v1::ImportSequenceResponse* response, const std::string& token) {
  grpc::ClientContext ctx;
  if (!token.empty()) ctx.AddMetadata("authorization", "Bearer " + token);
  auto writer = stub.ImportSequence(&ctx, response);
  for (const v1::SequenceChunk& c : chunks) {
    if (!writer->Write(c)) break;  // the server has answered already
  }
  writer->WritesDone();
  return writer->Finish();
}

std::string data_of(const std::vector<v1::SequenceChunk>& chunks) {
  std::string out;
  for (const v1::SequenceChunk& c : chunks) out += c.data();
  return out;
}

}  // namespace pagoda::e2e
