#pragma once
// pagoda-server as an object: the backend, cache manager, engine, gRPC service
// (with health and reflection) for one configuration. main.cc runs one from the
// command line; the end-to-end tests start one in-process on 127.0.0.1:0.
// gRPC headers stay out of this header (they are heavy).

#include <memory>
#include <string>

#include "pagoda/backend.h"
#include "pagoda/status.h"
#include "server_config.h"

namespace grpc {
class Server;
}

namespace pagoda {

class CacheManager;
class Engine;
class DecodeAttentionService;

class PagodaServer {
 public:
  // Builds everything and starts listening on config.raw.listen. Errors: the
  // backend's (e.g. INVALID_ARGUMENT for an unsupported geometry) or
  // UNAVAILABLE when the address cannot be bound.
  static StatusOr<std::unique_ptr<PagodaServer>> start(const EffectiveConfig& config);
  ~PagodaServer();  // shutdown() with no drain time if still running

  // The port actually bound (the one the system chose for port 0).
  int port() const { return port_; }
  // host:port with the bound port, e.g. "127.0.0.1:40123".
  const std::string& address() const { return address_; }

  // Graceful stop: health NOT_SERVING, new calls UNAVAILABLE, open streams
  // answer what they read; in-flight calls get up to `drain_seconds` to
  // finish (then are cancelled); then the engine stops. Blocks until done.
  void shutdown(double drain_seconds);
  bool draining() const;

  Backend& backend() { return *backend_; }
  CacheManager& cache() { return *cache_; }
  Engine& engine() { return *engine_; }
  const EffectiveConfig& config() const { return config_; }

 private:
  PagodaServer() = default;

  EffectiveConfig config_;
  std::unique_ptr<Backend> backend_;
  std::unique_ptr<CacheManager> cache_;
  std::unique_ptr<Engine> engine_;
  std::unique_ptr<DecodeAttentionService> service_;
  std::unique_ptr<grpc::Server> server_;
  int port_ = 0;
  std::string address_;
  bool stopped_ = false;
};

}  // namespace pagoda
