#pragma once
// The state behind Client and DecodeStream: the channel, the generated stub and
// the cached server configuration.

#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <string>

#include <grpcpp/channel.h>
#include <grpcpp/client_context.h>
#include <grpcpp/support/sync_stream.h>

#include "pagoda/client/client.h"
#include "pagoda/v1/decode_attention.grpc.pb.h"

namespace pagoda::client {

struct Client::Impl {
  std::string address;
  ClientOptions options;
  std::shared_ptr<grpc::Channel> channel;
  std::unique_ptr<v1::DecodeAttention::Stub> stub;
  std::mutex config_mu;
  std::optional<ServerConfig> config;  // guarded by config_mu

  // A context carrying the configured deadline, if any.
  void prepare(grpc::ClientContext& ctx) const;
  // The bearer token, when the options carry one (streams too).
  void authorize(grpc::ClientContext& ctx) const;
};

struct DecodeStream::Impl {
  ServerConfig config;
  std::unique_ptr<grpc::ClientContext> ctx;
  std::unique_ptr<grpc::ClientReaderWriter<v1::DecodeRequest, v1::DecodeResponse>> rw;
  std::deque<int64_t> rows;  // [outstanding] query rows of each request, in send order
  bool writes_done = false;
  std::optional<grpc::Status> final_status;  // set once Finish() has been called

  // Finish() exactly once; later calls return the same status.
  const grpc::Status& finish_once() {
    if (!final_status) final_status = rw->Finish();
    return *final_status;
  }
};

}  // namespace pagoda::client
