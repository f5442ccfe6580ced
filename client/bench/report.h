#pragma once
// pagoda-bench service's output: one table for people, one JSON object for CI
// and plots (--json), from the same figures.

#include <optional>
#include <string>
#include <vector>

#include "inprocess_decode.h"
#include "latency_stats.h"
#include "pagoda/client/types.h"
#include "service_workload.h"

namespace pagoda::bench {

struct ModeReport {
  std::string mode;          // unary, stream, getconfig
  LatencySummary latency;
  int64_t calls = 0;
  double mean_context = 0;   // tokens attended per sequence, mean over the calls
  double calls_per_s = 0;
  double sequences_per_s = 0;
  double kv_bytes_per_s = 0;
  double server_queue_us = 0;    // means of the server's own timing fields
  double server_compute_us = 0;
  double server_total_us = 0;
  // Mean latency minus the server's own total: the client, gRPC and the network
  // (for a stream with more than one request in flight, also the wait behind earlier requests).
  double outside_server_us = 0;
  // The in-process kernel on the same batch at the mean context of each round,
  // and the round's service sequences/s over its own (0 when not measured).
  std::optional<InprocessResult> inprocess;  // the median round's
  double service_over_inprocess = 0;         // median of round_ratios
  std::vector<double> round_ratios;          // [rounds] sorted
  // p50 / GetConfig's p50 over the same channel (0 when no baseline ran).
  double p50_over_getconfig = 0;
  int64_t errors = 0;
  std::string first_error;
};

struct ServiceReport {
  std::string server;
  client::ServerConfig config;
  WorkloadShape shape;
  std::vector<ModeReport> modes;
  double stream_over_unary_calls = 0;  // 0 unless both ran
};

ModeReport make_mode_report(RunResult& run, const client::ServerConfig& config);
void print_table(const ServiceReport& r);
void print_json(const ServiceReport& r);

}  // namespace pagoda::bench
