#pragma once
// Past one pod (docs/design.md §12, docs/scale-out.md): a client over several pagoda
// servers. New sequences are placed by a consistent-hash ring of the
// endpoints (64 virtual nodes each; FNV-1a + the splitmix64 finaliser, the
// same as the Python ShardedClient, so both place a key on the same pod), so
// adding a pod moves about 1/(pods + 1) of the keys. The server assigns the
// id, so a sequence is named by a SequenceRef (endpoint, id). A batch is split
// per pod, the parts sent concurrently, the results put back in request order.
// Errors from a pod name its endpoint ("127.0.0.1:5001: ..."); a pod that is
// down is UNAVAILABLE within the options' timeout, never a hang.

#include <cstdint>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "pagoda/client/client.h"

namespace pagoda::client {

struct SequenceRef {
  std::string endpoint;
  uint64_t sequence_id = 0;
};

class HashRing {
 public:
  explicit HashRing(const std::vector<std::string>& endpoints, int vnodes = 64);
  // The first n distinct endpoints clockwise from the key's hash.
  std::vector<std::string> owners(std::string_view key, size_t n = 1) const;
  static uint64_t hash(std::string_view text);

 private:
  std::vector<std::pair<uint64_t, std::string>> points_;  // sorted
};

// One decode step of a batch spread over pods (one query row per sequence).
struct ShardedDecodeArgs {
  int32_t layer = 0;
  std::vector<SequenceRef> sequences{};
  std::span<const float> q{};  // [batch, num_q_heads, head_dim]
  std::span<const float> k{};  // [batch, num_kv_heads, head_dim] or empty
  std::span<const float> v{};
  bool return_lse = false;
};

class ShardedClient {
 public:
  // One Client per endpoint, with `options` (timeout, token, TLS).
  static Result<std::unique_ptr<ShardedClient>> connect(const std::vector<std::string>& endpoints,
                                                        ClientOptions options = {});

  const HashRing& ring() const { return ring_; }
  Client& client(const std::string& endpoint);
  // GetConfig of the first pod (the pods of one deployment share the geometry).
  Result<ServerConfig> config();

  // On the pod the ring gives `placement_key` (the label when empty; a random
  // key when both are).
  Result<SequenceRef> create_sequence(const std::string& label = {}, const std::string& placement_key = {});
  Result<int32_t> append_kv(const SequenceRef& ref, int32_t layer, std::span<const float> k,
                            std::span<const float> v);
  Outcome free_sequence(const SequenceRef& ref);
  // Rows and lengths in the order of args.sequences.
  Result<DecodeResult> decode(const ShardedDecodeArgs& args);

 private:
  explicit ShardedClient(const std::vector<std::string>& endpoints) : ring_(endpoints) {}
  Error on(const std::string& endpoint, const Error& e) const;

  HashRing ring_;
  std::vector<std::string> endpoints_;
  std::map<std::string, std::unique_ptr<Client>> clients_;
};

}  // namespace pagoda::client
