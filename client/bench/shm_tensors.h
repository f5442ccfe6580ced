#pragma once
// The service benchmark's --shared-memory placement (docs/design.md §15): one
// client's q, k, v (in the wire dtype) and its output lie in a POSIX
// shared-memory region it registers with the server, so that each Decode call
// carries references instead of tensor bytes, and the server writes the
// output where the client reads it.

#include <cstdint>
#include <span>
#include <string>

#include "pagoda/client/client.h"
#include "pagoda/client/shared_memory.h"

namespace pagoda::bench {

class ShmTensors {
 public:
  // Creates the object "/<name>", copies q, k and v into it as `dtype`, leaves
  // room for `out_elems` output elements of `dtype`, and registers it under
  // `name` on `client`'s server (FAILED_PRECONDITION without
  // --allow-shared-memory). k and v may be empty (no appends).
  static client::Result<ShmTensors> place(client::Client& client, const std::string& name, std::span<const float> q,
                                          std::span<const float> k, std::span<const float> v, int64_t out_elems,
                                          DType dtype);
  ShmTensors(ShmTensors&& other) noexcept;
  ShmTensors& operator=(ShmTensors&&) = delete;
  ~ShmTensors();  // unregisters (best effort); the region unlinks its object

  // References a Decode call names: q, k, v (k, v unset when empty), output.
  void name_in(client::DecodeArgs& args) const;

 private:
  ShmTensors(client::Client& c, client::SharedMemoryRegion region) : client_(&c), region_(std::move(region)) {}

  client::Client* client_ = nullptr;  // null once moved from
  client::SharedMemoryRegion region_;
  client::ShmRef q_, k_, v_, out_;
};

}  // namespace pagoda::bench
