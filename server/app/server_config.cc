#include "app/server_config.h"

#include <cmath>

#include <fmt/format.h>

#include "app/kv_scales.h"
#include "auth/tokens_file.h"
#include "pagoda/geometry_rules.h"

namespace pagoda {
namespace {

Status check_positive(const char* flag, int64_t value) {
  if (value < 1) return InvalidArgument("{}: expected >= 1, received {}", flag, value);
  return Status::Ok();
}

bool one_of(const std::string& s, std::initializer_list<const char*> allowed) {
  for (const char* a : allowed)
    if (s == a) return true;
  return false;
}

}  // namespace

int64_t block_bytes(const CacheGeometry& g) {
  return g.token_kv_bytes() * g.block_size * g.num_layers;
}

StatusOr<EffectiveConfig> resolve_config(const ServerConfig& c) {
  PAGODA_RETURN_IF_ERROR(check_positive("--split-tokens", c.split_tokens));
  PAGODA_RETURN_IF_ERROR(check_positive("--max-batch", c.max_batch));
  const std::optional<DType> dtype = parse_dtype(c.cache_dtype);
  if (!dtype) {
    return InvalidArgument("--cache-dtype: expected fp32, fp16, bf16, fp8_e4m3 or fp8_e5m2, received '{}'",
                           c.cache_dtype);
  }
  // The geometry's own rules (pagoda/geometry_rules.h), with a capacity of one
  // block until the real one is known.
  // --v-head-dim 0 is --head-dim; a negative one reaches the rules and is refused there.
  CacheGeometry geometry{.num_layers = c.layers, .num_q_heads = c.q_heads, .num_kv_heads = c.kv_heads,
                         .head_dim = c.head_dim, .block_size = c.block_size, .num_blocks = 1, .dtype = *dtype,
                         .v_head_dim = c.v_head_dim != 0 ? c.v_head_dim : c.head_dim};
  PAGODA_RETURN_IF_ERROR(validate_geometry(geometry));
  if (c.split_tokens % c.block_size != 0) {
    return InvalidArgument("--split-tokens: expected a multiple of --block-size ({}), received {}",
                           c.block_size, c.split_tokens);
  }
  if (!one_of(c.mode, {"deterministic", "fast"})) {
    return InvalidArgument("--mode: expected deterministic or fast, received '{}'", c.mode);
  }
  if (!one_of(c.cpu_target, {"best", "amx", "avx512bf16", "avx3", "avx2"})) {
    return InvalidArgument("--cpu-target: expected best, amx, avx512bf16, avx3 or avx2, received '{}'", c.cpu_target);
  }
  if (!one_of(c.cpu_prefetch, {"auto", "l1", "l2"})) {
    return InvalidArgument("--cpu-prefetch: expected auto, l1 or l2, received '{}'", c.cpu_prefetch);
  }
  if (!one_of(c.backend, {"auto", "cpu", "cuda"})) {
    return InvalidArgument("--backend: expected auto, cpu or cuda, received '{}'", c.backend);
  }
  if (c.max_batch_wait_us < 0) {
    return InvalidArgument("--max-batch-wait-us: expected >= 0, received {}", c.max_batch_wait_us);
  }
  // gRPC takes the limit as an int.
  if (c.max_message_bytes < 1024 || c.max_message_bytes > INT32_MAX) {
    return InvalidArgument("--max-message-bytes: expected in [1024, {}], received {}", INT32_MAX,
                           c.max_message_bytes);
  }
  if (c.threads < 0) return InvalidArgument("--threads: expected >= 0 (0 = all cores), received {}", c.threads);
  PAGODA_RETURN_IF_ERROR(check_positive("--max-label-bytes", c.max_label_bytes));
  PAGODA_RETURN_IF_ERROR(check_positive("--max-request-tokens", c.max_request_tokens));
  PAGODA_RETURN_IF_ERROR(check_positive("--max-stream-in-flight", c.max_stream_in_flight));
  if (c.max_request_blocks < 0) {
    return InvalidArgument("--max-request-blocks: expected >= 0 (0 = no limit beyond the cache), received {}",
                           c.max_request_blocks);
  }
  if (!(c.idle_ttl >= 0) || !std::isfinite(c.idle_ttl)) {
    return InvalidArgument("--idle-ttl: expected >= 0 seconds (0 = off), received {}", c.idle_ttl);
  }
  if (c.max_sequences < 0) {
    return InvalidArgument("--max-sequences: expected >= 0 (0 = no limit), received {}", c.max_sequences);
  }
  if (c.max_sequence_tokens < 0) {
    return InvalidArgument("--max-sequence-tokens: expected >= 0 (0 = no limit), received {}", c.max_sequence_tokens);
  }
  if (c.tenant_max_blocks < 0) {
    return InvalidArgument("--tenant-max-blocks: expected >= 0 (0 = no limit), received {}", c.tenant_max_blocks);
  }
  if (c.tenant_max_sequences < 0) {
    return InvalidArgument("--tenant-max-sequences: expected >= 0 (0 = no limit), received {}",
                           c.tenant_max_sequences);
  }
  if (!(c.drain_timeout >= 0) || !std::isfinite(c.drain_timeout)) {
    return InvalidArgument("--drain-timeout: expected a finite number of seconds >= 0, received {}",
                           c.drain_timeout);
  }
  if (!(c.determinism_sample_rate >= 0 && c.determinism_sample_rate <= 1)) {
    return InvalidArgument("--determinism-sample-rate: expected in [0, 1], received {}",
                           c.determinism_sample_rate);
  }
  if (!(c.log_summary_interval >= 0) || !std::isfinite(c.log_summary_interval)) {
    return InvalidArgument("--log-summary-interval: expected a finite number of seconds >= 0 (0 = off), received {}",
                           c.log_summary_interval);
  }
  if (!one_of(c.log_level, {"trace", "debug", "info", "warn", "warning", "error", "critical", "off"})) {
    return InvalidArgument("--log-level: expected trace, debug, info, warn, error, critical or off, received '{}'",
                           c.log_level);
  }
  if (!one_of(c.log_format, {"text", "json"})) {
    return InvalidArgument("--log-format: expected text or json, received '{}'", c.log_format);
  }

  StatusOr<std::vector<KvScale>> scales = parse_kv_scales(c.kv_scales, c.layers);
  PAGODA_RETURN_IF_ERROR(scales.status());
  // Latent attention reads V from K's stored bytes: one scale per layer.
  if (geometry.latent()) {
    for (size_t l = 0; l < scales->size(); ++l) {
      const KvScale s = (*scales)[l];
      if (s.v != s.k) {
        return InvalidArgument("--kv-scales: expected the V scale equal to the K scale on a latent-attention server "
                               "(V is the first {} elements of K's row, stored once), received layer {} K {} V {}",
                               geometry.v_dim(), l, s.k, s.v);
      }
    }
  }

  EffectiveConfig e;
  e.raw = c;
  e.kv_scales = std::move(*scales);
  e.mode = c.mode == "fast" ? SplitMode::kFast : SplitMode::kDeterministic;
  e.geometry = geometry;
  CacheGeometry& g = e.geometry;
  int64_t blocks = c.num_blocks;
  if (blocks < 0) return InvalidArgument("--num-blocks: expected >= 0 (0 = from --cache-bytes), received {}", blocks);
  if (blocks == 0) {
    if (c.cache_bytes < 0) return InvalidArgument("--cache-bytes: expected >= 0, received {}", c.cache_bytes);
    blocks = c.cache_bytes / block_bytes(g);
    if (blocks < 1) {
      return InvalidArgument("--cache-bytes: expected at least one block ({} bytes with this geometry), received {}",
                             block_bytes(g), c.cache_bytes);
    }
  }
  if (blocks > INT32_MAX) {
    return InvalidArgument("--num-blocks: expected at most {}, received {}", INT32_MAX, blocks);
  }
  g.num_blocks = static_cast<int32_t>(blocks);
  // The default takes nothing from what the free cache, the tenant's quota and
  // --max-request-tokens allow: one request may fill the whole cache.
  e.max_request_blocks = c.max_request_blocks > 0 ? std::min(c.max_request_blocks, blocks) : blocks;
  StatusOr<TlsFiles> tls = read_tls_files(c);
  PAGODA_RETURN_IF_ERROR(tls.status());
  e.tls = std::move(*tls);
  StatusOr<MetricsCredentials> metrics_auth = read_metrics_auth_file(c.metrics_auth);
  PAGODA_RETURN_IF_ERROR(metrics_auth.status());
  e.metrics_auth = std::move(*metrics_auth);
  if (!c.auth_tokens.empty()) {
    // Read again at start (and on SIGHUP); a malformed file fails here, before anything starts.
    StatusOr<TokensFile> tokens = read_tokens_file(c.auth_tokens);
    PAGODA_RETURN_IF_ERROR(tokens.status());
    if (tokens->tokens.empty()) {
      return InvalidArgument("--auth-tokens {}: expected at least one token, received none", c.auth_tokens);
    }
  }
  return e;
}

std::string describe(const EffectiveConfig& e) {
  const ServerConfig& c = e.raw;
  const CacheGeometry& g = e.geometry;
  return fmt::format(
      "layers={} q_heads={} kv_heads={} head_dim={} v_head_dim={} block_size={} num_blocks={} cache_bytes={} "
      "cache_dtype={} kv_scales={} split_tokens={} mode={} max_batch={} max_batch_wait_us={} max_message_bytes={} "
      "max_label_bytes={} max_request_tokens={} max_request_blocks={} max_stream_in_flight={} idle_ttl={}s "
      "threads={} cpu_target={} cpu_prefetch={} backend={} drain_timeout={}s metrics_address={} determinism_sample_rate={} "
      "log_summary_interval={}s tls={} auth={} tenant_max_blocks={} tenant_max_sequences={} max_sequences={} "
      "max_sequence_tokens={} snapshot_dir={} metrics_tenant_labels={} metrics_auth={}",
      g.num_layers, g.num_q_heads, g.num_kv_heads, g.head_dim, g.v_dim(), g.block_size, g.num_blocks,
      block_bytes(g) * g.num_blocks, dtype_name(g.dtype), c.kv_scales, c.split_tokens, c.mode, c.max_batch,
      c.max_batch_wait_us, c.max_message_bytes, c.max_label_bytes, c.max_request_tokens, e.max_request_blocks,
      c.max_stream_in_flight, c.idle_ttl, c.threads, c.cpu_target, c.cpu_prefetch, c.backend, c.drain_timeout, c.metrics_address,
      c.determinism_sample_rate, c.log_summary_interval,
      !e.tls.enabled() ? "off" : e.tls.client_ca.empty() ? "on" : "mutual", c.auth_tokens.empty() ? "off" : c.auth_tokens,
      c.tenant_max_blocks, c.tenant_max_sequences, c.max_sequences, c.max_sequence_tokens,
      c.snapshot_dir.empty() ? "off" : c.snapshot_dir, c.metrics_tenant_labels ? "on" : "off",
      c.metrics_auth.empty() ? "off" : "basic");
}

}  // namespace pagoda
