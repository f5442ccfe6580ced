#pragma once
// pagoda's Prometheus metrics: every family is built in metrics.cc, and the service
// records through the typed calls below. Hot-path calls touch only label children
// resolved in advance (no family look-up, no allocation after a series' first use)
// and are safe to call from any thread.
//
// Families (docs/design.md §6; the README's metrics table describes each):
//   pagoda_rpc_duration_seconds{method,code}      histogram
//   pagoda_rpc_errors_total{method,code}          counter (code != OK)
//   pagoda_decode_stage_seconds{stage}            histogram
//   pagoda_decode_batch_size                      histogram (sequences per launch)
//   pagoda_decode_context_tokens                  histogram (tokens attended per sequence)
//   pagoda_kv_read_bytes_total                    counter (bytes actually read)
//   pagoda_kv_shared_bytes_total                  counter (reads a shared chunk saved)
//   pagoda_attention_compute_seconds_total        counter
//   pagoda_kv_blocks{state="used|free"}, pagoda_kv_usage_ratio, pagoda_sequences  gauges
//   pagoda_build_info{version,backend,device}     gauge, always 1
//   pagoda_determinism_checks_total{mode}, pagoda_determinism_mismatches_total{mode}
//   pagoda_determinism_max_abs_diff{mode}         gauge over a sliding window (metrics_window.h)

#include <array>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <vector>

#include "observability/metrics_labels.h"
#include "observability/metrics_summary.h"
#include "observability/metrics_window.h"
#include "pagoda/status.h"

namespace prometheus {
class Counter;
class Exposer;
class Gauge;
class Histogram;
class Registry;
template <typename T>
class Family;
}  // namespace prometheus

namespace pagoda {

struct MetricsOptions {
  // HOST:PORT the exposition listens on (`--metrics-address`); port 0 picks a free
  // port (tests). Empty: no HTTP endpoint, the metrics are still recorded.
  std::string address = "0.0.0.0:9464";
  // Window of pagoda_determinism_max_abs_diff.
  std::chrono::seconds determinism_window{60};
  // Layers with a pagoda_kv_saturated_total{layer} series (an fp8 cache's: all
  // of them, from 0); 0: the family has none.
  int32_t kv_saturation_layers = 0;
  // Series labelled with tenant names and usage (pagoda_tenant_*,
  // `--metrics-tenant-labels`); off, those families stay empty.
  bool tenant_labels = false;
  // HTTP basic auth on /metrics (`--metrics-auth`); empty user: none.
  std::string auth_user;
  std::string auth_password;
};

struct BuildInfo {
  std::string version;
  std::string backend;  // "cpu" or "cuda"
  std::string device;
};

class Metrics {
 public:
  // Builds every family and, when `options.address` is set, starts serving /metrics.
  // Errors: INVALID_ARGUMENT for a malformed address, UNAVAILABLE when it cannot bind.
  static StatusOr<std::unique_ptr<Metrics>> create(const MetricsOptions& options);
  ~Metrics();
  Metrics(const Metrics&) = delete;
  Metrics& operator=(const Metrics&) = delete;

  // The TCP port /metrics is served on (the bound one when 0 was asked); 0 without one.
  int port() const { return port_; }

  // Sets pagoda_build_info's labels; a second call replaces the first series.
  void set_build_info(const BuildInfo& info);

  // One finished RPC (for DecodeStream: one response message). `grpc_code` uses
  // gRPC's numbering (pagoda::StatusCode's values); non-OK also counts an error.
  void observe_rpc(RpcMethod method, int grpc_code, double seconds);
  void observe_stage(DecodeStage stage, double seconds);
  // One backend launch: its batch size and the tokens each sequence attended over.
  void observe_batch(std::span<const int32_t> context_tokens);  // [batch]
  // K/V bytes a launch read and the attention compute time it took (their rates'
  // ratio is the achieved bandwidth).
  // One launch: the K/V bytes it read (a shared chunk once, chunks outside
  // every row's window not at all), the reads sharing saved, its compute time.
  void add_kv_read(double bytes, double shared_bytes, double compute_seconds);
  void set_cache(int64_t used_blocks, int64_t free_blocks, int64_t sequences);
  // Sequences --idle-ttl freed.
  void add_sequences_evicted(int64_t n);
  // K/V elements of `layer` an fp8 cache clamped to its largest finite value.
  void add_kv_saturated(int32_t layer, int64_t elements);
  // A call refused UNAUTHENTICATED: reason "missing", "malformed" or "unknown".
  void add_auth_failure(std::string_view reason);
  // A snapshot written after the drain (restore false) or restored at start:
  // its duration, file bytes and (restore) the files skipped.
  void observe_snapshot(bool restore, double seconds, int64_t bytes, int64_t failures);
  // One authenticated call of tenant `id` (named `name`), in
  // pagoda_tenant_requests_total{tenant}; tenants come from the tokens file, so
  // the label set is bounded by it. Both tenant calls do nothing unless
  // MetricsOptions::tenant_labels.
  // `name` is asked for only the first time a tenant is seen (its series are
  // kept by id, so a call costs a lookup and an increment).
  void add_tenant_request(uint32_t id, const std::function<std::string()>& name);
  // The blocks and sequences tenant `id` (named `name`) holds
  // (pagoda_tenant_kv_blocks, pagoda_tenant_sequences).
  void set_tenant_usage(uint32_t id, std::string_view name, int64_t blocks, int64_t sequences);
  // One determinism re-check of a sequence: whether its bytes differed, and the
  // largest absolute element difference (0 when identical).
  void record_determinism_check(SplitMode mode, bool mismatch, double max_abs_diff);

  // Every family in the text exposition format, as /metrics serves it (tests,
  // and servers built without an exposition address).
  std::string exposition() const;

  // Totals since the previous call, for the periodic summary log line (not the hot path).
  MetricsSummary summary_since_last();

 private:
  class MaxAbsDiffCollectable;
  explicit Metrics(const MetricsOptions& options);
  prometheus::Histogram& rpc_duration(RpcMethod method, std::size_t code_index);
  prometheus::Counter& rpc_errors(RpcMethod method, std::size_t code_index);

  std::shared_ptr<prometheus::Registry> registry_;
  prometheus::Family<prometheus::Histogram>* rpc_duration_family_ = nullptr;
  prometheus::Family<prometheus::Counter>* rpc_errors_family_ = nullptr;
  prometheus::Family<prometheus::Gauge>* build_info_family_ = nullptr;
  prometheus::Family<prometheus::Counter>* tenant_requests_family_ = nullptr;
  prometheus::Family<prometheus::Gauge>* tenant_blocks_family_ = nullptr;
  prometheus::Family<prometheus::Gauge>* tenant_sequences_family_ = nullptr;
  struct TenantSeries {
    prometheus::Counter* requests = nullptr;
    prometheus::Gauge* blocks = nullptr;
    prometheus::Gauge* sequences = nullptr;
  };
  // Under tenant_mutex_: tenant id's gauges, created with `name` on first use
  // (the request counter only once a call of that tenant was authenticated).
  TenantSeries& tenant_series(uint32_t id, std::string_view name);
  std::mutex tenant_mutex_;
  std::vector<TenantSeries> tenant_series_;  // [tenant id], under tenant_mutex_

  // (method, code) children, created on first use under `series_mutex_`: the full
  // cross product would publish hundreds of empty series.
  static constexpr std::size_t kRpcSeries = kNumRpcMethods * kNumGrpcCodes;
  std::mutex series_mutex_;
  std::array<std::atomic<prometheus::Histogram*>, kRpcSeries> rpc_duration_{};
  std::array<std::atomic<prometheus::Counter*>, kRpcSeries> rpc_errors_{};

  std::array<prometheus::Histogram*, kNumDecodeStages> stage_seconds_{};
  prometheus::Histogram* batch_size_ = nullptr;
  prometheus::Histogram* context_tokens_ = nullptr;
  prometheus::Counter* kv_read_bytes_ = nullptr;
  prometheus::Counter* kv_shared_bytes_ = nullptr;
  prometheus::Counter* attention_compute_seconds_ = nullptr;
  std::vector<prometheus::Counter*> kv_saturated_;  // [kv_saturation_layers]
  prometheus::Counter* sequences_evicted_ = nullptr;
  prometheus::Gauge* snapshot_write_seconds_ = nullptr;
  prometheus::Gauge* snapshot_restore_seconds_ = nullptr;
  prometheus::Counter* snapshot_write_bytes_ = nullptr;
  prometheus::Counter* snapshot_restore_bytes_ = nullptr;
  prometheus::Counter* snapshot_restore_failures_ = nullptr;
  prometheus::Counter* auth_missing_ = nullptr;
  prometheus::Counter* auth_malformed_ = nullptr;
  prometheus::Counter* auth_unknown_ = nullptr;
  prometheus::Gauge* kv_blocks_used_ = nullptr;
  prometheus::Gauge* kv_blocks_free_ = nullptr;
  prometheus::Gauge* kv_usage_ratio_ = nullptr;
  prometheus::Gauge* sequences_ = nullptr;
  std::mutex build_info_mutex_;
  prometheus::Gauge* build_info_ = nullptr;
  std::array<prometheus::Counter*, kNumSplitModes> determinism_checks_{};
  std::array<prometheus::Counter*, kNumSplitModes> determinism_mismatches_{};
  std::shared_ptr<MaxAbsDiffCollectable> max_abs_diff_;

  // What summary_since_last() saw last time.
  std::mutex summary_mutex_;
  std::chrono::steady_clock::time_point summary_time_ = std::chrono::steady_clock::now();
  uint64_t summary_requests_ = 0;
  uint64_t summary_errors_ = 0;
  std::vector<double> summary_decode_buckets_;  // [latency buckets + 1], not cumulative

  const bool tenant_labels_;
  std::unique_ptr<prometheus::Exposer> exposer_;  // last: stops serving before the rest goes
  int port_ = 0;
};

}  // namespace pagoda
