#include "app/server.h"

#include "app/idle_sweeper.h"
#include "app/snapshot_steps.h"

#include <algorithm>
#include <chrono>
#include <thread>
#include <vector>

#include <grpcpp/ext/proto_server_reflection_plugin.h>
#include <grpcpp/grpcpp.h>
#include <grpcpp/health_check_service_interface.h>
#include <spdlog/spdlog.h>

#include "auth/authenticator.h"
#include "cache/cache_manager.h"
#include "engine/determinism_checker.h"
#include "engine/engine.h"
#include "observability/cache_gauges.h"
#include "observability/metrics.h"
#include "observability/summary_logger.h"
#include "rpc/parse_failure_interceptor.h"
#include "rpc/service.h"

namespace pagoda {
namespace {

// "0.0.0.0:0" with bound port 40123 -> "0.0.0.0:40123".
std::string with_port(const std::string& listen, int port) {
  const auto colon = listen.rfind(':');
  return (colon == std::string::npos ? listen : listen.substr(0, colon)) + ":" + std::to_string(port);
}

// Plaintext, TLS, or TLS requiring a client certificate signed by the CA.
std::shared_ptr<grpc::ServerCredentials> server_credentials(const TlsFiles& tls) {
  if (!tls.enabled()) return grpc::InsecureServerCredentials();
  grpc::SslServerCredentialsOptions options(tls.client_ca.empty()
                                                ? GRPC_SSL_DONT_REQUEST_CLIENT_CERTIFICATE
                                                : GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY);
  options.pem_root_certs = tls.client_ca;
  options.pem_key_cert_pairs.push_back({tls.private_key, tls.cert_chain});
  return grpc::SslServerCredentials(options);
}

// Takes gRPC's reflection plugin off one builder. The plugin is registered for
// every builder of the process as soon as the reflection library is loaded
// (its static initializer), so not calling InitProtoReflectionServerBuilderPlugin
// is not enough. Reflection answers without a token: under --auth-tokens it
// would describe the service to anyone.
class WithoutReflection final : public grpc::ServerBuilderOption {
 public:
  void UpdateArguments(grpc::ChannelArguments*) override {}
  void UpdatePlugins(std::vector<std::unique_ptr<grpc::ServerBuilderPlugin>>* plugins) override {
    std::erase_if(*plugins, [](const auto& p) { return p->name() == "proto_server_reflection"; });
  }
};

}  // namespace

Status PagodaServer::reload_auth() {
  PAGODA_RETURN_IF_ERROR(auth_->reload());
  apply_tenant_limits();
  return Status::Ok();
}

void PagodaServer::apply_tenant_limits() {
  const ServerConfig& raw = config_.raw;
  cache_->set_tenant_limits(kDefaultTenant, {"default", raw.tenant_max_blocks, raw.tenant_max_sequences});
  for (const Authenticator::Tenant& t : auth_->tenants()) {
    cache_->set_tenant_limits(t.id, {t.name, t.quota.max_blocks, t.quota.max_sequences});
  }
}

// What the service admits requests against, from the settings.
ServiceSettings service_settings(const EffectiveConfig& config) {
  const ServerConfig& raw = config.raw;
  ServiceSettings settings;
  settings.geometry = config.geometry;
  settings.mode = config.mode;
  settings.split_tokens = raw.split_tokens;
  settings.max_batch = raw.max_batch;
  settings.max_batch_wait_us = raw.max_batch_wait_us;
  settings.max_message_bytes = raw.max_message_bytes;
  settings.max_label_bytes = raw.max_label_bytes;
  settings.max_request_tokens = raw.max_request_tokens;
  settings.max_request_blocks = config.max_request_blocks;
  settings.max_stream_in_flight = raw.max_stream_in_flight;
  settings.idle_ttl = raw.idle_ttl;
  settings.tls = config.tls.enabled();
  settings.max_sequences = raw.max_sequences;
  settings.max_sequence_tokens = raw.max_sequence_tokens;
  settings.kv_scales = config.kv_scales;
  return settings;
}

// The backend first, then the metrics: settings either rejects fail before
// any port is bound.
Status PagodaServer::open_backend_and_metrics() {
  const ServerConfig& raw = config_.raw;
  BackendOptions options;
  options.kind = raw.backend;
  options.geometry = config_.geometry;
  options.cpu_threads = raw.threads;
  options.cpu_target = raw.cpu_target;
  options.cpu_prefetch = raw.cpu_prefetch;
  options.max_batch = raw.max_batch;
  options.kv_scales = config_.kv_scales;
  StatusOr<std::unique_ptr<Backend>> backend = make_backend(options);
  PAGODA_RETURN_IF_ERROR(backend.status());
  backend_ = std::move(*backend);
  MetricsOptions metrics;
  metrics.address = raw.metrics_address;
  if (is_fp8(config_.geometry.dtype)) metrics.kv_saturation_layers = config_.geometry.num_layers;
  metrics.tenant_labels = raw.metrics_tenant_labels;
  metrics.auth_user = config_.metrics_auth.user;
  metrics.auth_password = config_.metrics_auth.password;
  StatusOr<std::unique_ptr<Metrics>> created = Metrics::create(metrics);
  PAGODA_RETURN_IF_ERROR(created.status());
  metrics_ = std::move(*created);
  if (metrics_->port() > 0) metrics_address_ = with_port(raw.metrics_address, metrics_->port());
  metrics_->set_build_info({PAGODA_VERSION, backend_->name(), backend_->device_name()});
  return Status::Ok();
}

// The cache and what listens to it: the gauges (its change listener) and the
// fp8 saturation counter.
void PagodaServer::open_cache() {
  const ServerConfig& raw = config_.raw;
  cache_ = std::make_unique<CacheManager>(backend_->geometry());
  cache_->set_max_request_blocks(config_.max_request_blocks);
  cache_->set_max_sequences(raw.max_sequences);
  cache_->set_max_sequence_tokens(raw.max_sequence_tokens);
  cache_->set_saturation_observer(
      [m = metrics_.get()](int32_t layer, int64_t elements) { m->add_kv_saturated(layer, elements); });
  cache_gauges_ = std::make_unique<CacheGauges>(*cache_, *metrics_);
  cache_->set_change_listener([g = cache_gauges_.get()] { g->publish(); });
  cache_gauges_->publish();
}

// The determinism checker (its own stream when it samples) and the engine.
Status PagodaServer::open_engine() {
  const ServerConfig& raw = config_.raw;
  DeterminismCheckerOptions checks;
  checks.sample_rate = raw.determinism_sample_rate;
  checks.mode = config_.mode;
  checks.split_tokens = raw.split_tokens;
  std::unique_ptr<BackendStream> check_stream;
  if (checks.sample_rate > 0) {
    StatusOr<std::unique_ptr<BackendStream>> stream = backend_->open_stream();
    PAGODA_RETURN_IF_ERROR(stream.status());
    check_stream = std::move(*stream);
  }
  checker_ = std::make_unique<DeterminismChecker>(std::move(check_stream), *cache_, *metrics_, checks);
  EngineOptions engine;
  engine.max_batch = raw.max_batch;
  engine.max_batch_wait_us = raw.max_batch_wait_us;
  engine.mode = config_.mode;
  engine.split_tokens = raw.split_tokens;
  EngineObservers observers;
  observers.metrics = metrics_.get();
  observers.checker = checker_.get();
  StatusOr<std::unique_ptr<Engine>> created = Engine::create(*backend_, *cache_, engine, observers);
  PAGODA_RETURN_IF_ERROR(created.status());
  engine_ = std::move(*created);
  return Status::Ok();
}

// Tokens (and the tenants' quotas), shared-memory regions, the service.
Status PagodaServer::open_service() {
  const ServerConfig& raw = config_.raw;
  if (raw.auth_tokens.empty()) {
    auth_ = std::make_unique<Authenticator>();
  } else {
    StatusOr<std::unique_ptr<Authenticator>> auth =
        Authenticator::from_file(raw.auth_tokens, {raw.tenant_max_blocks, raw.tenant_max_sequences});
    PAGODA_RETURN_IF_ERROR(auth.status());
    auth_ = std::move(*auth);
  }
  apply_tenant_limits();
  shm_ = std::make_unique<SharedMemoryRegistry>(raw.allow_shared_memory);
  service_ = std::make_unique<DecodeAttentionService>(service_settings(config_), *backend_, *cache_, *engine_,
                                                      *metrics_, *auth_, *shm_);
  return Status::Ok();
}

// The gRPC server: health, reflection (not under auth), the service, the
// parse-failure interceptor and the message limits, bound to --listen.
Status PagodaServer::open_grpc() {
  const ServerConfig& raw = config_.raw;
  // Both process-wide switches must be set before the builder is created.
  // Reflection answers without a token, so it is served only when auth is off.
  grpc::EnableDefaultHealthCheckService(true);
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  grpc::ServerBuilder builder;
  if (auth_->enabled()) builder.SetOption(std::make_unique<WithoutReflection>());
  builder.AddListeningPort(raw.listen, server_credentials(config_.tls), &port_);
  builder.RegisterService(service_.get());
  std::vector<std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface>> interceptors;
  interceptors.push_back(std::make_unique<ParseFailureInterceptorFactory>());
  builder.experimental().SetInterceptorCreators(std::move(interceptors));
  // The service refuses every message past --max-message-bytes itself, so
  // that an oversized request on a DecodeStream is answered on its own; gRPC's
  // own limit would end the whole stream. So the transport takes the largest
  // message gRPC can carry (2 GiB): a client may make the server hold one such
  // message while it is refused.
  builder.SetMaxReceiveMessageSize(INT32_MAX);
  builder.SetMaxSendMessageSize(static_cast<int>(raw.max_message_bytes));
  server_ = builder.BuildAndStart();
  if (server_ && port_ != 0) return Status::Ok();
  if (config_.tls.enabled()) {
    return Unavailable("--listen, --tls-cert, --tls-key: expected an address this process can bind and a key "
                       "that matches its certificate, received '{}', '{}', '{}'", raw.listen, raw.tls_cert,
                       raw.tls_key);
  }
  return Unavailable("--listen: expected an address this process can bind, received '{}'", raw.listen);
}

StatusOr<std::unique_ptr<PagodaServer>> PagodaServer::start(const EffectiveConfig& config) {
  std::unique_ptr<PagodaServer> s(new PagodaServer());
  s->config_ = config;
  const ServerConfig& raw = config.raw;
  PAGODA_RETURN_IF_ERROR(s->open_backend_and_metrics());
  s->open_cache();
  PAGODA_RETURN_IF_ERROR(s->open_engine());
  Status status = s->open_service();
  // A snapshot's id state is taken before any id is handed out.
  const bool restoring = status.ok() && !raw.snapshot_dir.empty() && restore_snapshot_ids(s->snapshot_parts());
  if (status.ok()) status = s->open_grpc();
  if (!status.ok()) {
    s->engine_->stop();
    return status;
  }
  if (restoring) {
    s->server_->GetHealthCheckService()->SetServingStatus(false);
    restore_snapshot_sequences(s->snapshot_parts());  // the cache reports what it restored
  }
  s->server_->GetHealthCheckService()->SetServingStatus(true);
  s->address_ = with_port(raw.listen, s->port_);
  DeterminismChecker* checker = s->checker_.get();
  s->summary_ = std::make_unique<SummaryLogger>(
      *s->metrics_,
      [checker] {
        const DeterminismChecker::Stats c = checker->stats();
        return CheckCounts{c.checked, c.mismatches, c.skipped};
      },
      std::chrono::duration<double>(raw.log_summary_interval));
  if (raw.idle_ttl > 0) {
    s->sweeper_ = std::make_unique<IdleSweeper>(*s->cache_, *s->metrics_,
                                                std::chrono::duration<double>(raw.idle_ttl));
  }
  return s;
}

PagodaServer::~PagodaServer() {
  if (sweeper_) sweeper_->stop();
  if (server_ && !stopped_) shutdown(0);
  if (summary_) summary_->stop();
  if (engine_) engine_->stop();
  if (checker_) checker_->stop();
}

bool PagodaServer::draining() const { return service_->draining(); }

void PagodaServer::shutdown(double drain_seconds) {
  if (stopped_) return;
  stopped_ = true;
  spdlog::info("shutdown: draining, health NOT_SERVING, new calls UNAVAILABLE, up to {} s for in-flight calls",
               drain_seconds);
  const auto t0 = std::chrono::steady_clock::now();
  server_->GetHealthCheckService()->SetServingStatus(false);
  service_->begin_drain();
  // While calls are in flight the server keeps accepting connections, so that
  // a new call reaches a handler and gets a clear UNAVAILABLE. Then Shutdown
  // stops listening and cancels whatever is left at the deadline; the engine
  // keeps running meanwhile so queued work finishes.
  const auto drain_for = std::chrono::microseconds(static_cast<int64_t>(drain_seconds * 1e6));
  const auto deadline = std::chrono::steady_clock::now() + drain_for;
  while (service_->active_calls() > 0 && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  // Shutdown would cancel the calls gRPC has accepted but not yet handed to a
  // handler, and a cancelled call cannot tell its client whether it ran. So
  // the server listens on, refusing with UNAVAILABLE, until no call has
  // arrived for kQuiet (or the drain time is up).
  constexpr auto kQuiet = std::chrono::milliseconds(50);
  int64_t refused = service_->refused_while_draining();
  auto quiet_since = std::chrono::steady_clock::now();
  while (std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
    const int64_t now_refused = service_->refused_while_draining();
    const auto now = std::chrono::steady_clock::now();
    if (now_refused != refused || service_->active_calls() > 0) {
      refused = now_refused;
      quiet_since = now;
    } else if (now - quiet_since >= kQuiet) {
      break;
    }
  }
  if (service_->active_calls() > 0) {
    spdlog::warn("shutdown: {} calls still in flight after {} s; cancelling them", service_->active_calls(),
                 drain_seconds);
  }
  // Shutdown sends GOAWAY and waits for every connection to close, and a
  // client that keeps an idle channel open does not close it (gRPC's graceful
  // GOAWAY then waits up to ~20 s for a ping the server's ping policy may hold
  // back). No call of ours is in flight now, so a short grace lets a call
  // already on the wire reach a handler and get UNAVAILABLE; at its end
  // Shutdown closes the idle connections.
  constexpr auto kGoawayGrace = std::chrono::milliseconds(100);
  const auto left = std::clamp(deadline - std::chrono::steady_clock::now(), std::chrono::steady_clock::duration::zero(),
                               std::chrono::steady_clock::duration(kGoawayGrace));
  server_->Shutdown(std::chrono::system_clock::now() +
                    std::chrono::duration_cast<std::chrono::system_clock::duration>(left));
  server_->Wait();
  if (sweeper_) sweeper_->stop();
  engine_->stop();
  summary_->stop();
  // Checks still queued are dropped: a drain does not wait for re-computations.
  checker_->stop();
  if (checker_->enabled()) {
    const DeterminismChecker::Stats checks = checker_->stats();
    spdlog::info("shutdown: determinism checks: {} done, {} mismatches, {} skipped (queue full or sequence freed)",
                 checks.checked, checks.mismatches, checks.skipped);
  }
  if (!config_.raw.snapshot_dir.empty()) write_snapshot_after_drain(snapshot_parts());
  const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  spdlog::info("shutdown: done in {:.3f} s", took);
}

SnapshotParts PagodaServer::snapshot_parts() {
  SnapshotParts p;
  p.dir = config_.raw.snapshot_dir;
  p.cache = cache_.get();
  p.backend = backend_.get();
  p.auth = auth_.get();
  p.metrics = metrics_.get();
  p.max_label_bytes = config_.raw.max_label_bytes;
  p.max_sequence_tokens = config_.raw.max_sequence_tokens;
  return p;
}

}  // namespace pagoda
