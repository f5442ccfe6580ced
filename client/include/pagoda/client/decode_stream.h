#pragma once
// A DecodeStream session: requests go out as they are sent, responses come back
// one per request in request order, each carrying its request's request_id. The
// session numbers requests itself (unless the caller sets request_id) and checks
// every response against the oldest request still waiting, so a response that
// does not match is an error, never silently attributed to the wrong step.
//
// Pipelining: send() several requests before receive() to keep the server busy
// (a decode loop whose next step does not depend on this step's output). One
// thread at a time may send and one may receive.

#include <cstdint>
#include <deque>
#include <memory>

#include "pagoda/client/error.h"
#include "pagoda/client/types.h"

namespace pagoda::client {

class DecodeStream {
 public:
  ~DecodeStream();
  DecodeStream(const DecodeStream&) = delete;
  DecodeStream& operator=(const DecodeStream&) = delete;

  // Sends one request; returns its request_id.
  Result<uint64_t> send(const DecodeArgs& args);
  // The response to the oldest outstanding request. A request the server
  // rejected comes back as an Error with the server's code and message (the
  // stream carries on).
  Result<DecodeResult> receive();
  // send() then receive(): one synchronous step when nothing else is outstanding
  // (otherwise it returns the oldest outstanding response, as receive() does).
  Result<DecodeResult> call(const DecodeArgs& args);
  // Requests sent and not yet received.
  size_t outstanding() const { return pending_.size(); }
  // Half-closes, drains what is outstanding and returns the stream's final status.
  Outcome finish();

  struct Impl;
  explicit DecodeStream(std::unique_ptr<Impl> impl);

 private:
  std::unique_ptr<Impl> impl_;
  std::deque<uint64_t> pending_;  // request ids in send order
  uint64_t next_id_ = 1;
  bool finished_ = false;
};

}  // namespace pagoda::client
