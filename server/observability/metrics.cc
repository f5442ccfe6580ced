#include "observability/metrics.h"

#include <algorithm>
#include <charconv>
#include <exception>
#include <string_view>
#include <vector>

#include <prometheus/client_metric.h>
#include <prometheus/collectable.h>
#include <prometheus/counter.h>
#include <prometheus/exposer.h>
#include <prometheus/family.h>
#include <prometheus/gauge.h>
#include <prometheus/histogram.h>
#include <prometheus/metric_family.h>
#include <prometheus/registry.h>
#include <prometheus/text_serializer.h>

#include "auth/constant_time.h"

namespace pagoda {
namespace {

std::size_t series_index(RpcMethod method, std::size_t code_index) {
  return static_cast<std::size_t>(method) * kNumGrpcCodes + code_index;
}

prometheus::Labels rpc_labels(RpcMethod method, std::size_t code_index) {
  return {{"method", std::string(rpc_method_name(method))},
          {"code", std::string(grpc_code_name(static_cast<int>(code_index)))}};
}

// HOST:PORT with a port in 0..65535 (HOST may be a bracketed IPv6 address).
Status check_address(const std::string& address) {
  const std::size_t colon = address.rfind(':');
  const std::string_view port =
      colon == std::string::npos ? std::string_view() : std::string_view(address).substr(colon + 1);
  int value = -1;
  const auto [end, ec] = std::from_chars(port.data(), port.data() + port.size(), value);
  if (colon == 0 || colon == std::string::npos || port.empty() || ec != std::errc() ||
      end != port.data() + port.size() || value < 0 || value > 65535) {
    return InvalidArgument("metrics_address: expected HOST:PORT with a port in 0..65535, got '{}'",
                           address);
  }
  return Status::Ok();
}

}  // namespace

// Serves pagoda_determinism_max_abs_diff computed at scrape time, so the window is
// exact whenever Prometheus looks, checks or no checks.
class Metrics::MaxAbsDiffCollectable : public prometheus::Collectable {
 public:
  explicit MaxAbsDiffCollectable(std::chrono::seconds window)
      : windows_{WindowedMax(window), WindowedMax(window)}, window_(window) {}

  void record(SplitMode mode, double value) {
    windows_[static_cast<std::size_t>(mode)].record(value, WindowedMax::Clock::now());
  }

  std::vector<prometheus::MetricFamily> Collect() const override {
    prometheus::MetricFamily family;
    family.name = "pagoda_determinism_max_abs_diff";
    family.help = "Largest absolute element difference between a returned output and its "
                  "re-check, over the last " + std::to_string(window_.count()) + " s (0 when none)";
    family.type = prometheus::MetricType::Gauge;
    const auto now = WindowedMax::Clock::now();
    for (SplitMode mode : {SplitMode::kDeterministic, SplitMode::kFast}) {
      prometheus::ClientMetric metric;
      metric.label.push_back({"mode", std::string(split_mode_name(mode))});
      metric.gauge.value = windows_[static_cast<std::size_t>(mode)].max(now);
      family.metric.push_back(std::move(metric));
    }
    return {std::move(family)};
  }

 private:
  std::array<WindowedMax, kNumSplitModes> windows_;
  std::chrono::seconds window_;
};

Metrics::Metrics(const MetricsOptions& options)
    : registry_(std::make_shared<prometheus::Registry>()),
      max_abs_diff_(std::make_shared<MaxAbsDiffCollectable>(options.determinism_window)),
      tenant_labels_(options.tenant_labels) {
  using prometheus::BuildCounter;
  using prometheus::BuildGauge;
  using prometheus::BuildHistogram;
  prometheus::Registry& r = *registry_;
  const auto latency = latency_buckets_seconds();

  rpc_duration_family_ = &BuildHistogram()
                              .Name("pagoda_rpc_duration_seconds")
                              .Help("Time from a call's arrival to its response, by method and gRPC status code")
                              .Register(r);
  rpc_errors_family_ = &BuildCounter()
                            .Name("pagoda_rpc_errors_total")
                            .Help("Calls that ended with a status other than OK, by method and code")
                            .Register(r);
  // OK series exist from the start so that rates read 0, not "no data", on an idle server.
  for (std::size_t m = 0; m < kNumRpcMethods; ++m) {
    rpc_duration_[series_index(static_cast<RpcMethod>(m), 0)] =
        &rpc_duration_family_->Add(rpc_labels(static_cast<RpcMethod>(m), 0), latency);
  }

  auto& stages = BuildHistogram()
                     .Name("pagoda_decode_stage_seconds")
                     .Help("Time a decode batch spent in each stage (queue, append, attention, merge, transfer)")
                     .Register(r);
  for (std::size_t s = 0; s < kNumDecodeStages; ++s) {
    stage_seconds_[s] = &stages.Add(
        {{"stage", std::string(decode_stage_name(static_cast<DecodeStage>(s)))}}, latency);
  }

  batch_size_ = &BuildHistogram()
                     .Name("pagoda_decode_batch_size")
                     .Help("Sequences per backend launch")
                     .Register(r)
                     .Add({}, batch_size_buckets());
  context_tokens_ = &BuildHistogram()
                         .Name("pagoda_decode_context_tokens")
                         .Help("Tokens each decoded sequence attended over")
                         .Register(r)
                         .Add({}, context_tokens_buckets());
  kv_read_bytes_ = &BuildCounter()
                        .Name("pagoda_kv_read_bytes_total")
                        .Help("Bytes of K and V read by attention (a chunk shared by forks once)")
                        .Register(r)
                        .Add({});
  kv_shared_bytes_ = &BuildCounter()
                          .Name("pagoda_kv_shared_bytes_total")
                          .Help("Bytes of K and V reads saved by reading chunks shared by forks once")
                          .Register(r)
                          .Add({});
  attention_compute_seconds_ = &BuildCounter()
                                    .Name("pagoda_attention_compute_seconds_total")
                                    .Help("Time spent computing attention; kv_read_bytes rate over this rate is the achieved bandwidth")
                                    .Register(r)
                                    .Add({});

  sequences_evicted_ = &BuildCounter()
                            .Name("pagoda_sequences_evicted_total")
                            .Help("Sequences freed by --idle-ttl after going unused that long")
                            .Register(r)
                            .Add({});
  auto& snapshot_seconds = BuildGauge()
                               .Name("pagoda_snapshot_seconds")
                               .Help("Seconds the last snapshot took: written after the drain, or restored at start")
                               .Register(r);
  snapshot_write_seconds_ = &snapshot_seconds.Add({{"phase", "write"}});
  snapshot_restore_seconds_ = &snapshot_seconds.Add({{"phase", "restore"}});
  auto& snapshot_bytes = BuildCounter()
                             .Name("pagoda_snapshot_bytes_total")
                             .Help("Bytes of snapshot files written (phase write) or read (phase restore)")
                             .Register(r);
  snapshot_write_bytes_ = &snapshot_bytes.Add({{"phase", "write"}});
  snapshot_restore_bytes_ = &snapshot_bytes.Add({{"phase", "restore"}});
  snapshot_restore_failures_ = &BuildCounter()
                                    .Name("pagoda_snapshot_restore_failures_total")
                                    .Help("Snapshot files skipped at start: corrupt, truncated or mismatched")
                                    .Register(r)
                                    .Add({});
  auto& auth = BuildCounter()
                   .Name("pagoda_auth_failures_total")
                   .Help("Calls refused UNAUTHENTICATED, by reason (missing, malformed or unknown token)")
                   .Register(r);
  auth_missing_ = &auth.Add({{"reason", "missing"}});
  auth_malformed_ = &auth.Add({{"reason", "malformed"}});
  auth_unknown_ = &auth.Add({{"reason", "unknown"}});
  tenant_requests_family_ = &BuildCounter()
                                 .Name("pagoda_tenant_requests_total")
                                 .Help("Authenticated calls by tenant (a DecodeStream counts once)")
                                 .Register(r);
  tenant_blocks_family_ = &BuildGauge()
                               .Name("pagoda_tenant_kv_blocks")
                               .Help("KV cache blocks a tenant holds (a block its forks share counts once)")
                               .Register(r);
  tenant_sequences_family_ =
      &BuildGauge().Name("pagoda_tenant_sequences").Help("Sequences a tenant holds").Register(r);
  auto& saturated = BuildCounter()
                        .Name("pagoda_kv_saturated_total")
                        .Help("K/V elements an fp8 cache clamped to its largest finite value on append, by layer")
                        .Register(r);
  for (int32_t l = 0; l < options.kv_saturation_layers; ++l) {
    kv_saturated_.push_back(&saturated.Add({{"layer", std::to_string(l)}}));
  }

  auto& blocks = BuildGauge().Name("pagoda_kv_blocks").Help("KV cache blocks by state").Register(r);
  kv_blocks_used_ = &blocks.Add({{"state", "used"}});
  kv_blocks_free_ = &blocks.Add({{"state", "free"}});
  kv_usage_ratio_ = &BuildGauge()
                         .Name("pagoda_kv_usage_ratio")
                         .Help("Used KV blocks over all KV blocks (0..1)")
                         .Register(r)
                         .Add({});
  sequences_ = &BuildGauge().Name("pagoda_sequences").Help("Live sequences").Register(r).Add({});
  build_info_family_ = &BuildGauge()
                            .Name("pagoda_build_info")
                            .Help("Always 1; labels name the version, backend and device")
                            .Register(r);

  auto& checks = BuildCounter()
                     .Name("pagoda_determinism_checks_total")
                     .Help("Decoded sequences recomputed alone and compared with what was returned")
                     .Register(r);
  auto& mismatches = BuildCounter()
                         .Name("pagoda_determinism_mismatches_total")
                         .Help("Re-checks whose output bytes differed from what was returned")
                         .Register(r);
  for (SplitMode mode : {SplitMode::kDeterministic, SplitMode::kFast}) {
    const prometheus::Labels labels{{"mode", std::string(split_mode_name(mode))}};
    determinism_checks_[static_cast<std::size_t>(mode)] = &checks.Add(labels);
    determinism_mismatches_[static_cast<std::size_t>(mode)] = &mismatches.Add(labels);
  }
}

Metrics::~Metrics() = default;

StatusOr<std::unique_ptr<Metrics>> Metrics::create(const MetricsOptions& options) {
  if (options.determinism_window.count() <= 0) {
    return InvalidArgument("determinism_window: expected > 0 s, got {} s",
                           options.determinism_window.count());
  }
  std::unique_ptr<Metrics> metrics(new Metrics(options));
  if (options.address.empty()) return metrics;
  PAGODA_RETURN_IF_ERROR(check_address(options.address));
  try {
    // One serving thread: Prometheus scrapes a few times a minute.
    metrics->exposer_ = std::make_unique<prometheus::Exposer>(options.address, 1);
  } catch (const std::exception& e) {
    return Unavailable("metrics_address: cannot listen on '{}': {}", options.address, e.what());
  }
  if (!options.auth_user.empty()) {
    // Compared in full whatever matches, as the gRPC tokens are.
    metrics->exposer_->RegisterAuth(
        [user = options.auth_user, password = options.auth_password](const std::string& u, const std::string& p) {
          return static_cast<bool>(equal_in_constant_time(u, user) & equal_in_constant_time(p, password));
        },
        "pagoda");
  }
  metrics->exposer_->RegisterCollectable(metrics->registry_);
  metrics->exposer_->RegisterCollectable(metrics->max_abs_diff_);
  const std::vector<int> ports = metrics->exposer_->GetListeningPorts();
  metrics->port_ = ports.empty() ? 0 : ports.front();
  return metrics;
}

void Metrics::set_build_info(const BuildInfo& info) {
  std::lock_guard lock(build_info_mutex_);
  if (build_info_ != nullptr) build_info_family_->Remove(build_info_);
  build_info_ = &build_info_family_->Add(
      {{"version", info.version}, {"backend", info.backend}, {"device", info.device}});
  build_info_->Set(1);
}

prometheus::Histogram& Metrics::rpc_duration(RpcMethod method, std::size_t code_index) {
  std::atomic<prometheus::Histogram*>& slot = rpc_duration_[series_index(method, code_index)];
  if (prometheus::Histogram* h = slot.load(std::memory_order_acquire)) return *h;
  std::lock_guard lock(series_mutex_);
  if (slot.load(std::memory_order_relaxed) == nullptr) {
    slot.store(&rpc_duration_family_->Add(rpc_labels(method, code_index), latency_buckets_seconds()),
               std::memory_order_release);
  }
  return *slot.load(std::memory_order_relaxed);
}

prometheus::Counter& Metrics::rpc_errors(RpcMethod method, std::size_t code_index) {
  std::atomic<prometheus::Counter*>& slot = rpc_errors_[series_index(method, code_index)];
  if (prometheus::Counter* c = slot.load(std::memory_order_acquire)) return *c;
  std::lock_guard lock(series_mutex_);
  if (slot.load(std::memory_order_relaxed) == nullptr) {
    slot.store(&rpc_errors_family_->Add(rpc_labels(method, code_index)), std::memory_order_release);
  }
  return *slot.load(std::memory_order_relaxed);
}

void Metrics::observe_rpc(RpcMethod method, int grpc_code, double seconds) {
  const std::size_t code = grpc_code_index(grpc_code);
  rpc_duration(method, code).Observe(seconds);
  if (code != 0) rpc_errors(method, code).Increment();
}

void Metrics::observe_stage(DecodeStage stage, double seconds) {
  stage_seconds_[static_cast<std::size_t>(stage)]->Observe(seconds);
}

void Metrics::observe_batch(std::span<const int32_t> context_tokens) {
  batch_size_->Observe(static_cast<double>(context_tokens.size()));
  // Bucketed here and added under one lock, instead of one locked Observe per sequence.
  static const std::vector<double> bounds = context_tokens_buckets();
  thread_local std::vector<double> increments;
  increments.assign(bounds.size() + 1, 0.0);  // + the +Inf bucket
  double sum = 0;
  for (int32_t tokens : context_tokens) {
    const auto v = static_cast<double>(tokens);
    const auto bucket = std::lower_bound(bounds.begin(), bounds.end(), v) - bounds.begin();
    increments[static_cast<std::size_t>(bucket)] += 1;
    sum += v;
  }
  context_tokens_->ObserveMultiple(increments, sum);
}

void Metrics::add_kv_read(double bytes, double shared_bytes, double compute_seconds) {
  kv_read_bytes_->Increment(bytes);
  kv_shared_bytes_->Increment(shared_bytes);
  attention_compute_seconds_->Increment(compute_seconds);
}

std::string Metrics::exposition() const { return prometheus::TextSerializer().Serialize(registry_->Collect()); }

void Metrics::add_sequences_evicted(int64_t n) { sequences_evicted_->Increment(static_cast<double>(n)); }

void Metrics::observe_snapshot(bool restore, double seconds, int64_t bytes, int64_t failures) {
  (restore ? snapshot_restore_seconds_ : snapshot_write_seconds_)->Set(seconds);
  (restore ? snapshot_restore_bytes_ : snapshot_write_bytes_)->Increment(static_cast<double>(bytes));
  if (restore) snapshot_restore_failures_->Increment(static_cast<double>(failures));
}

void Metrics::add_auth_failure(std::string_view reason) {
  (reason == "missing" ? auth_missing_ : reason == "malformed" ? auth_malformed_ : auth_unknown_)->Increment();
}

Metrics::TenantSeries& Metrics::tenant_series(uint32_t id, std::string_view name) {
  if (id >= tenant_series_.size()) tenant_series_.resize(id + 1);
  TenantSeries& s = tenant_series_[id];
  if (s.blocks == nullptr) {
    const std::map<std::string, std::string> labels{{"tenant", std::string(name)}};
    s.blocks = &tenant_blocks_family_->Add(labels);
    s.sequences = &tenant_sequences_family_->Add(labels);
  }
  return s;
}

void Metrics::add_tenant_request(uint32_t id, const std::function<std::string()>& name) {
  if (!tenant_labels_) return;
  prometheus::Counter* counter = nullptr;
  {
    std::lock_guard lock(tenant_mutex_);
    if (id < tenant_series_.size()) counter = tenant_series_[id].requests;
    if (counter == nullptr) {
      const std::string n = name();
      TenantSeries& s = tenant_series(id, n);
      s.requests = &tenant_requests_family_->Add({{"tenant", n}});
      counter = s.requests;
    }
  }
  counter->Increment();
}

void Metrics::set_tenant_usage(uint32_t id, std::string_view name, int64_t blocks, int64_t sequences) {
  if (!tenant_labels_) return;
  std::lock_guard lock(tenant_mutex_);
  TenantSeries& s = tenant_series(id, name);
  s.blocks->Set(static_cast<double>(blocks));
  s.sequences->Set(static_cast<double>(sequences));
}

void Metrics::add_kv_saturated(int32_t layer, int64_t elements) {
  if (layer >= 0 && layer < static_cast<int32_t>(kv_saturated_.size())) {
    kv_saturated_[static_cast<size_t>(layer)]->Increment(static_cast<double>(elements));
  }
}

void Metrics::set_cache(int64_t used_blocks, int64_t free_blocks, int64_t sequences) {
  kv_blocks_used_->Set(static_cast<double>(used_blocks));
  kv_blocks_free_->Set(static_cast<double>(free_blocks));
  const int64_t total = used_blocks + free_blocks;
  kv_usage_ratio_->Set(total > 0 ? static_cast<double>(used_blocks) / static_cast<double>(total) : 0.0);
  sequences_->Set(static_cast<double>(sequences));
}

void Metrics::record_determinism_check(SplitMode mode, bool mismatch, double max_abs_diff) {
  const auto m = static_cast<std::size_t>(mode);
  determinism_checks_[m]->Increment();
  if (mismatch) determinism_mismatches_[m]->Increment();
  max_abs_diff_->record(mode, max_abs_diff);
}

MetricsSummary Metrics::summary_since_last() {
  static const std::vector<double> bounds = latency_buckets_seconds();
  std::lock_guard lock(summary_mutex_);
  const auto now = std::chrono::steady_clock::now();
  uint64_t requests = 0;
  uint64_t errors = 0;
  std::vector<double> decode(bounds.size() + 1, 0.0);  // since start, per bucket
  for (std::size_t m = 0; m < kNumRpcMethods; ++m) {
    const auto method = static_cast<RpcMethod>(m);
    const bool is_decode = method == RpcMethod::kDecode || method == RpcMethod::kDecodeStream;
    for (std::size_t code = 0; code < kNumGrpcCodes; ++code) {
      const prometheus::Histogram* h = rpc_duration_[series_index(method, code)].load(std::memory_order_acquire);
      if (h == nullptr) continue;
      const prometheus::ClientMetric metric = h->Collect();
      requests += metric.histogram.sample_count;
      if (code != 0) errors += metric.histogram.sample_count;
      if (!is_decode || code != 0) continue;
      uint64_t previous = 0;
      for (std::size_t b = 0; b < metric.histogram.bucket.size() && b < decode.size(); ++b) {
        const uint64_t cumulative = metric.histogram.bucket[b].cumulative_count;
        decode[b] += static_cast<double>(cumulative - previous);
        previous = cumulative;
      }
    }
  }
  if (summary_decode_buckets_.size() != decode.size()) summary_decode_buckets_.assign(decode.size(), 0.0);
  std::vector<double> interval(decode.size());
  for (std::size_t b = 0; b < decode.size(); ++b) interval[b] = decode[b] - summary_decode_buckets_[b];

  MetricsSummary summary;
  summary.interval_seconds = std::chrono::duration<double>(now - summary_time_).count();
  summary.requests = requests - summary_requests_;
  summary.errors = errors - summary_errors_;
  summary.decode_p99_seconds = bucket_quantile(0.99, bounds, interval);
  summary.kv_usage_ratio = kv_usage_ratio_->Value();
  summary.sequences = static_cast<int64_t>(sequences_->Value());

  summary_time_ = now;
  summary_requests_ = requests;
  summary_errors_ = errors;
  summary_decode_buckets_ = std::move(decode);
  return summary;
}

}  // namespace pagoda
