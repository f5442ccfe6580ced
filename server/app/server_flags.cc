#include "app/server_flags.h"

#include <cctype>
#include <string>

#include <CLI/CLI.hpp>

#include "pagoda/cpu_targets.h"

namespace pagoda {
namespace {

// "--kv-heads" -> "PAGODA_KV_HEADS".
std::string env_name(const std::string& flag) {
  std::string env = "PAGODA_";
  for (char ch : flag.substr(2)) env += ch == '-' ? '_' : static_cast<char>(std::toupper(static_cast<unsigned char>(ch)));
  return env;
}

template <typename T>
void add(CLI::App& app, const std::string& flag, T& value, const std::string& help) {
  app.add_option(flag, value, help)->envname(env_name(flag))->capture_default_str();
}

}  // namespace

void add_server_flags(CLI::App& app, ServerConfig& c) {
  add(app, "--listen", c.listen, "gRPC listen address, host:port (port 0 picks a free port)");
  add(app, "--metrics-address", c.metrics_address, "Prometheus exposition address, host:port (port 0 picks a free port; empty: not served)");
  app.add_flag("--metrics-tenant-labels", c.metrics_tenant_labels,
               "Publish per-tenant series on /metrics (tenant names, calls and cache usage); off by default")
      ->envname(env_name("--metrics-tenant-labels"));
  add(app, "--metrics-auth", c.metrics_auth,
      "File of one line 'USER:PASSWORD': /metrics asks for HTTP basic auth with it (empty: open)");
  add(app, "--layers", c.layers, "Model layers whose K/V the cache holds");
  add(app, "--q-heads", c.q_heads, "Query heads per token");
  add(app, "--kv-heads", c.kv_heads, "K/V heads per token (q-heads must be a multiple: GQA)");
  add(app, "--head-dim", c.head_dim, "Elements per q and K head (64, 128, 256 or 576)");
  add(app, "--v-head-dim", c.v_head_dim,
      "Elements per V head and output head (0: --head-dim). Less than --head-dim is latent attention "
      "(576 with 512: MLA, one KV head): V is the first N elements of K's row, stored once, and appends carry k alone");
  add(app, "--block-size", c.block_size, "Tokens per cache block");
  add(app, "--num-blocks", c.num_blocks, "Cache capacity in blocks (0: derived from --cache-bytes)");
  add(app, "--cache-bytes", c.cache_bytes, "Cache capacity in bytes, K and V of every layer (used when --num-blocks is 0)");
  add(app, "--cache-dtype", c.cache_dtype, "Element type of the cache: fp32, fp16, bf16, fp8_e4m3 or fp8_e5m2");
  add(app, "--kv-scales", c.kv_scales,
      "K and V scales of the cache (stored = x / scale): 'K,V' for every layer, or a file of "
      "'layer k_scale v_scale' lines");
  add(app, "--split-tokens", c.split_tokens, "Split-KV chunk length in tokens (a multiple of --block-size)");
  add(app, "--mode", c.mode, "deterministic (bits independent of batching) or fast (split count adapts)");
  add(app, "--max-batch", c.max_batch, "Most sequences coalesced into one backend launch");
  add(app, "--max-batch-wait-us", c.max_batch_wait_us,
      "Longest a Decode waits, in microseconds, for calls already arriving to join its batch (0: never wait)");
  add(app, "--max-message-bytes", c.max_message_bytes, "Largest gRPC message received or sent, bytes");
  add(app, "--max-label-bytes", c.max_label_bytes, "Longest CreateSequence label, bytes");
  add(app, "--max-request-tokens", c.max_request_tokens, "Most tokens one AppendKV or Decode appends");
  add(app, "--max-request-blocks", c.max_request_blocks,
      "Most new cache blocks one request may take (0: no limit beyond the cache itself)");
  add(app, "--max-stream-in-flight", c.max_stream_in_flight,
      "DecodeStream requests read and not yet answered, per stream (the next read waits)");
  add(app, "--max-sequences", c.max_sequences, "Most sequences the server holds, every tenant's together (0: no limit)");
  add(app, "--max-sequence-tokens", c.max_sequence_tokens, "Most tokens one sequence holds in a layer (0: no limit)");
  add(app, "--idle-ttl", c.idle_ttl, "Seconds a sequence may go unused before it is freed (0: never)");
  add(app, "--snapshot-dir", c.snapshot_dir,
      "Directory every sequence is written to after the drain on SIGTERM and restored from at start (empty: off)");
  add(app, "--tls-cert", c.tls_cert, "PEM certificate chain: serve TLS (1.2+) on the gRPC port (with --tls-key)");
  add(app, "--tls-key", c.tls_key, "PEM private key of --tls-cert");
  add(app, "--tls-client-ca", c.tls_client_ca, "PEM CA certificates: require client certificates they sign (mTLS)");
  add(app, "--auth-tokens", c.auth_tokens,
      "Bearer tokens file, 'TENANT TOKEN [max_blocks=N] [max_sequences=N]' a line; SIGHUP reloads it (empty: no auth)");
  add(app, "--tenant-max-blocks", c.tenant_max_blocks, "Cache blocks a tenant may hold unless its line says (0: no limit)");
  add(app, "--tenant-max-sequences", c.tenant_max_sequences,
      "Sequences a tenant may hold unless its line says (0: no limit)");
  app.add_flag("--allow-shared-memory", c.allow_shared_memory,
               "Let clients on this host register POSIX shared-memory regions and pass tensors in them")
      ->envname(env_name("--allow-shared-memory"));
  add(app, "--threads", c.threads, "CPU backend threads (0: all cores)");
  add(app, "--cpu-target", c.cpu_target,
      std::string("CPU kernel target: best (all this CPU has: ") + pagoda::cpu::kBestTargetRule +
          "; else AVX-512 or AVX2), amx (tiles for every bf16 and fp8 cache, refusing to start without AMX), "
          "avx512bf16 (dot products for every bf16 and fp8 cache, refusing to start without AVX512-BF16), avx3 "
          "(AVX-512 FMAs, fp32 arithmetic throughout), avx2");
  add(app, "--cpu-prefetch", c.cpu_prefetch,
      "Where CPU kernel tasks request the K/V lines they read next: auto (the levels measured faster on this CPU "
      "family), l1 or l2 (every path); changes no bits");
  add(app, "--backend", c.backend, "auto (CUDA when a device answers, else CPU), cpu or cuda");
  add(app, "--drain-timeout", c.drain_timeout, "Seconds in-flight calls get to finish after SIGTERM/SIGINT");
  add(app, "--determinism-sample-rate", c.determinism_sample_rate,
      "Fraction of decoded sequences re-checked alone for bitwise determinism (0 to 1)");
  add(app, "--log-level", c.log_level, "trace, debug, info, warn, error, critical or off");
  add(app, "--log-format", c.log_format, "text or json (one JSON object a line)");
  add(app, "--log-summary-interval", c.log_summary_interval,
      "Seconds between summary log lines (requests, p99, cache usage); 0: none");
}

}  // namespace pagoda
