#pragma once
// The server's settings: one field per flag of docs/design.md §5's table (flag names,
// environment variables and defaults live in server_flags.cc), checked as a whole
// before anything starts.

#include <cstdint>
#include <string>
#include <vector>

#include "pagoda/backend.h"
#include "pagoda/split_plan.h"
#include "app/metrics_auth_file.h"
#include "app/tls_files.h"
#include "pagoda/status.h"

namespace pagoda {

struct ServerConfig {
  std::string listen = "0.0.0.0:50051";           // gRPC address; port 0 picks a free one
  std::string metrics_address = "0.0.0.0:9464";   // Prometheus exposition address; empty: not served
  bool metrics_tenant_labels = false;              // pagoda_tenant_* series (tenant names and usage)
  std::string metrics_auth;                        // file of 'USER:PASSWORD' for /metrics; empty: open
  int32_t layers = 2;
  int32_t q_heads = 8;
  int32_t kv_heads = 2;
  int32_t head_dim = 64;
  int32_t v_head_dim = 0;                          // 0: head_dim; less: V is K's prefix (latent attention)
  int32_t block_size = 16;                         // tokens per block
  int64_t num_blocks = 0;                          // 0: derived from cache_bytes
  int64_t cache_bytes = int64_t{256} << 20;        // K+V of every layer, bytes (K alone when latent)
  std::string cache_dtype = "fp16";                // fp32, fp16, bf16, fp8_e4m3, fp8_e5m2
  std::string kv_scales = "1,1";                   // "K,V" for every layer, or a file (app/kv_scales.h)
  int32_t split_tokens = 512;                      // multiple of block_size
  std::string mode = "deterministic";              // deterministic or fast
  int32_t max_batch = 256;                         // sequences per launch
  int64_t max_batch_wait_us = 50;                  // 0: never wait for more work
  int64_t max_message_bytes = int64_t{64} << 20;   // gRPC receive and send limit
  int32_t max_label_bytes = 256;                   // CreateSequence's label
  int32_t max_request_tokens = 65536;              // tokens one AppendKV or Decode appends
  int64_t max_request_blocks = 0;                  // new blocks one request takes; 0: the whole cache
  int32_t max_stream_in_flight = 64;               // DecodeStream requests read and not yet answered
  int64_t max_sequences = 1 << 20;                 // sequences held, all tenants; 0: no limit
  int64_t max_sequence_tokens = 1 << 20;           // tokens one sequence holds in a layer; 0: no limit
  double idle_ttl = 0;                             // seconds a sequence may go unused; 0: forever
  std::string tls_cert;                            // PEM certificate chain: serve TLS
  std::string tls_key;                             // PEM private key of tls_cert
  std::string tls_client_ca;                       // PEM CA: require and verify client certificates
  std::string auth_tokens;                         // tokens file (auth/tokens_file.h); empty: no auth
  std::string snapshot_dir;                        // sequences written here after a drain, restored at start
  int64_t tenant_max_blocks = 0;                   // a tenant's blocks unless its line says; 0: no limit
  int64_t tenant_max_sequences = 0;                // a tenant's sequences unless its line says; 0: no limit
  bool allow_shared_memory = false;                // co-located clients may register shared memory
  int32_t threads = 0;                             // CPU backend threads; 0 = all cores
  std::string cpu_target = "best";                 // CPU kernel target: best, amx, avx512bf16, avx3, avx2
  std::string cpu_prefetch = "auto";               // where CPU tasks request K/V lines: auto, l1, l2
  std::string backend = "auto";                    // auto, cpu, cuda
  double drain_timeout = 30;                       // seconds
  double determinism_sample_rate = 0.01;           // fraction of sequences re-checked
  std::string log_level = "info";
  std::string log_format = "text";                 // text or json
  double log_summary_interval = 60;                // seconds between summary lines; 0 = none
};

// The settings once checked and derived (dtype parsed, capacity in blocks).
struct EffectiveConfig {
  ServerConfig raw;
  CacheGeometry geometry;   // num_blocks resolved from cache_bytes when not given
  std::vector<KvScale> kv_scales;  // [num_layers]
  int64_t max_request_blocks = 0;  // resolved: > 0
  TlsFiles tls;                    // read from the --tls-* files
  MetricsCredentials metrics_auth; // read from --metrics-auth
  SplitMode mode = SplitMode::kDeterministic;
};

// Checks every field and every combination (split_tokens a multiple of
// block_size, q_heads a multiple of kv_heads, capacity of at least one block,
// known dtype, mode, backend and log settings). Messages name the flag, the
// expected and the received value.
StatusOr<EffectiveConfig> resolve_config(const ServerConfig& config);

// Bytes one block takes in every layer, K and V together.
int64_t block_bytes(const CacheGeometry& g);

// One line of the effective settings, for the start-up log.
std::string describe(const EffectiveConfig& config);

}  // namespace pagoda
