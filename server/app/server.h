#pragma once
// pagoda-server as an object: the backend, cache manager, engine, gRPC service
// (with health and reflection) for one configuration. main.cc runs one from the
// command line; the end-to-end tests start one in-process on 127.0.0.1:0.
// gRPC headers stay out of this header (they are heavy).

#include <memory>
#include <string>

#include "pagoda/backend.h"
#include "pagoda/status.h"
#include "app/server_config.h"

namespace grpc {
class Server;
}

namespace pagoda {

class CacheGauges;
class SharedMemoryRegistry;
class CacheManager;
class DeterminismChecker;
class Engine;
class DecodeAttentionService;
class Metrics;
class SummaryLogger;
class IdleSweeper;
class Authenticator;
struct SnapshotParts;

class PagodaServer {
 public:
  // Builds everything and starts listening on config.raw.listen (gRPC) and
  // config.raw.metrics_address (/metrics, unless empty). Errors: the backend's
  // (e.g. INVALID_ARGUMENT for an unsupported geometry), INVALID_ARGUMENT for a
  // malformed metrics address, UNAVAILABLE when an address cannot be bound.
  static StatusOr<std::unique_ptr<PagodaServer>> start(const EffectiveConfig& config);
  ~PagodaServer();  // shutdown() with no drain time if still running

  // The port actually bound (the one the system chose for port 0).
  int port() const { return port_; }
  // host:port with the bound port, e.g. "127.0.0.1:40123".
  const std::string& address() const { return address_; }
  // host:port /metrics is served on, with the bound port; empty when not served.
  const std::string& metrics_address() const { return metrics_address_; }

  // Graceful stop: health NOT_SERVING, new calls UNAVAILABLE, open streams
  // answer what they read; in-flight calls get up to `drain_seconds` to
  // finish (then are cancelled); then the engine stops. Blocks until done.
  void shutdown(double drain_seconds);
  bool draining() const;
  // Re-reads --auth-tokens (SIGHUP): new tokens apply from the next call; on
  // an error the old ones stay and the error says why. OK when auth is off.
  Status reload_auth();

  Backend& backend() { return *backend_; }
  CacheManager& cache() { return *cache_; }
  Engine& engine() { return *engine_; }
  Metrics& metrics() { return *metrics_; }
  DeterminismChecker& checker() { return *checker_; }
  const EffectiveConfig& config() const { return config_; }

 private:
  PagodaServer() = default;
  // The steps of start(), in order (server.cc says what each opens).
  Status open_backend_and_metrics();
  void open_cache();
  Status open_engine();
  Status open_service();
  Status open_grpc();
  // The cache's quota of every tenant: the tokens file's, else the --tenant-max-* defaults.
  void apply_tenant_limits();
  // What the --snapshot-dir steps (snapshot_steps.h) act on.
  SnapshotParts snapshot_parts();

  // Declared in dependency order: each is destroyed before what it uses.
  EffectiveConfig config_;
  std::unique_ptr<Metrics> metrics_;
  std::unique_ptr<Backend> backend_;
  std::unique_ptr<CacheManager> cache_;
  std::unique_ptr<CacheGauges> cache_gauges_;
  std::unique_ptr<Authenticator> auth_;
  std::unique_ptr<SharedMemoryRegistry> shm_;  // before the service, which refers to it
  std::unique_ptr<DeterminismChecker> checker_;
  std::unique_ptr<Engine> engine_;
  std::unique_ptr<DecodeAttentionService> service_;
  std::unique_ptr<grpc::Server> server_;
  std::unique_ptr<SummaryLogger> summary_;
  std::unique_ptr<IdleSweeper> sweeper_;  // with --idle-ttl
  int port_ = 0;
  std::string address_;
  std::string metrics_address_;
  bool stopped_ = false;
};

}  // namespace pagoda
