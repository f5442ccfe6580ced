// pagoda-server: settings from flags and PAGODA_* environment variables, one
// PagodaServer, a graceful drain on SIGTERM/SIGINT, and SIGHUP re-reading the
// --auth-tokens file.
//
// Exit codes: 0 after a drain, 2 for invalid settings (including a geometry the
// backend does not support), 1 when the server cannot start otherwise.
#include <pthread.h>
#include <signal.h>

#include <cstdio>
#include <cstdlib>
#include <string>

#include <CLI/CLI.hpp>
#include <spdlog/spdlog.h>

#include "app/server.h"
#include "app/server_config.h"
#include "observability/logging.h"
#include "app/server_flags.h"
#include "pagoda/heap_retention.h"

namespace {

constexpr int kExitInvalidSettings = 2;
constexpr int kExitStartFailed = 1;

bool is_settings_error(const pagoda::Status& s) {
  return s.code() == pagoda::StatusCode::kInvalidArgument || s.code() == pagoda::StatusCode::kFailedPrecondition;
}

}  // namespace

int main(int argc, char** argv) {
  // First of all: every thread inherits the mask (spdlog's flusher, gRPC's,
  // the engine's), and this thread takes the signals with sigwait, so no
  // handler runs inside gRPC or the engine and no thread dies of a SIGTERM.
  sigset_t stop_signals;
  sigemptyset(&stop_signals);
  sigaddset(&stop_signals, SIGTERM);
  sigaddset(&stop_signals, SIGINT);
  sigaddset(&stop_signals, SIGHUP);
  pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);

  pagoda::ServerConfig settings;
  CLI::App app{"pagoda-server: paged decode attention over gRPC (pagoda.v1.DecodeAttention)", "pagoda-server"};
  pagoda::add_server_flags(app, settings);
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    app.exit(e);
    return kExitInvalidSettings;
  }

  pagoda::StatusOr<pagoda::EffectiveConfig> config = pagoda::resolve_config(settings);
  if (!config.ok()) {
    std::fprintf(stderr, "pagoda-server: invalid settings: %s\n", config.status().message().c_str());
    return kExitInvalidSettings;
  }
  const pagoda::Status logging = pagoda::configure_logging(settings.log_level, settings.log_format);
  if (!logging.ok()) {
    std::fprintf(stderr, "pagoda-server: invalid settings: %s\n", logging.message().c_str());
    return kExitInvalidSettings;
  }

  spdlog::info("pagoda-server {} starting: {}", PAGODA_VERSION, pagoda::describe(*config));
  // Before the service allocates its first request: every call's tensors then
  // reuse the heap's pages (pagoda/heap_retention.h).
  spdlog::info("{}", pagoda::retain_freed_heap(std::getenv("GLIBC_TUNABLES")).detail);
  pagoda::StatusOr<std::unique_ptr<pagoda::PagodaServer>> server = pagoda::PagodaServer::start(*config);
  if (!server.ok()) {
    spdlog::critical("pagoda-server: cannot start: {}", server.status().message());
    return is_settings_error(server.status()) ? kExitInvalidSettings : kExitStartFailed;
  }
  pagoda::PagodaServer& s = **server;
  const pagoda::CacheGeometry& g = s.config().geometry;
  spdlog::info("backend {} on {}; cache {} blocks x {} tokens ({} tokens per layer, {} MiB, {})", s.backend().name(),
               s.backend().device_name(), g.num_blocks, g.block_size, static_cast<int64_t>(g.num_blocks) * g.block_size,
               pagoda::block_bytes(g) * g.num_blocks >> 20, pagoda::dtype_name(g.dtype));
  spdlog::info("listening on {} ({}; pagoda.v1.DecodeAttention, grpc.health.v1{}{})", s.address(),
               !config->tls.enabled() ? "plaintext" : config->tls.client_ca.empty() ? "TLS" : "mutual TLS",
               settings.auth_tokens.empty() ? ", reflection" : "",
               settings.auth_tokens.empty() ? "" : "; bearer tokens required");
  if (s.metrics_address().empty()) {
    spdlog::info("metrics: recorded, not served (--metrics-address is empty)");
  } else {
    spdlog::info("metrics at http://{}/metrics; determinism checks of {} of decoded sequences", s.metrics_address(),
                 settings.determinism_sample_rate);
  }

  int signal_number = 0;
  for (;;) {
    sigwait(&stop_signals, &signal_number);
    if (signal_number != SIGHUP) break;
    const pagoda::Status reloaded = s.reload_auth();
    if (reloaded.ok()) {
      spdlog::info("received SIGHUP; {}", settings.auth_tokens.empty() ? "no --auth-tokens to reload"
                                                                        : "tokens reloaded from " + settings.auth_tokens);
    } else {
      spdlog::error("received SIGHUP; tokens not reloaded, the previous ones stay: {}", reloaded.message());
    }
  }
  spdlog::info("received {}; draining", signal_number == SIGTERM ? "SIGTERM" : "SIGINT");
  s.shutdown(settings.drain_timeout);
  // Everything that serves or computes has stopped. Tearing down the metrics
  // endpoint would wait out its HTTP server's poll interval (about a second
  // measured, for nothing): the process exits here instead, logs flushed.
  spdlog::info("pagoda-server stopped");
  spdlog::shutdown();
  std::fflush(nullptr);
  std::_Exit(0);
}
