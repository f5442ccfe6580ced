#pragma once
// Export and import over the generated stubs, for the transfer tests.

#include <grpcpp/grpcpp.h>

#include <gtest/gtest.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "e2e_fixture.h"
#include "pagoda/v1/decode_attention.grpc.pb.h"

namespace pagoda::e2e {

// One in-process server of a transfer (source or destination), its stub and a
// Session on it; shut down when destroyed.
struct Node {
  std::unique_ptr<PagodaServer> server;
  std::unique_ptr<v1::DecodeAttention::Stub> stub;
  Session session;

  explicit Node(const ServerConfig& c) : server(start_server(c)), stub(make_stub(*server)) {
    session.stub = stub.get();
    session.g = server->config().geometry;
  }
  ~Node() { server->shutdown(0); }
  v1::GetConfigResponse config() {
    v1::GetConfigResponse r;
    EXPECT_TRUE(session.config(r).ok());
    return r;
  }
};

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
