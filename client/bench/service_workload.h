#pragma once
// The service benchmark's workload: each client owns `batch` sequences filled to
// `context` tokens in every benchmarked layer, then issues Decode calls that
// append one new token per sequence (a real decode step), cycling through the
// layers, unary or on one DecodeStream per client.

#include <cstdint>
#include <string>
#include <vector>

#include "connection_flags.h"
#include "pagoda/client/client.h"

namespace pagoda::bench {

enum class CallMode { kUnary, kStream, kGetConfig };
const char* call_mode_name(CallMode m);

struct WorkloadShape {
  int32_t clients = 1;
  int32_t batch = 1;          // sequences per Decode call
  int32_t context = 128;      // tokens cached per sequence and layer before the run
  int32_t layers = 1;         // layers the calls cycle through (<= the server's)
  int64_t steps = 200;        // measured calls per client (when duration_s is 0)
  double duration_s = 0;      // measured seconds per mode instead of a step count
  int64_t warmup = 20;        // unmeasured calls per client first
  int32_t in_flight = 1;      // stream only: requests in flight per stream
  int32_t q_len = 1;          // query rows (and appended tokens) per sequence and call
  int32_t window = 0;         // sliding window of every call, 0: none
  bool append = true;         // each call appends a token (false: lengths stay at context)
  // Each client's sequences are forks of one parent holding the context
  // (ForkSequence count): their whole chunks are shared and read once.
  bool shared_prefix = false;
  // q, k, v and the output lie in a shared-memory region per client (a server
  // with --allow-shared-memory): calls carry references, not tensor bytes.
  bool shared_memory = false;
  DType dtype = DType::kFloat32;  // wire dtype of q, k, v
};

// One client's sequences (ids) per the shape; created and filled by prepare().
struct ClientSequences {
  std::vector<uint64_t> ids;  // [batch]
};

// Creates and fills every client's sequences. Fails on the first error.
client::Result<std::vector<ClientSequences>> prepare_sequences(client::Client& client,
                                                               const client::ServerConfig& config,
                                                               const WorkloadShape& shape);
// Frees them (best effort).
void free_sequences(client::Client& client, const std::vector<ClientSequences>& seqs);

struct RunResult {
  CallMode mode = CallMode::kUnary;
  std::vector<double> latencies_us;  // [calls] measured calls only
  double wall_s = 0;                 // first measured call sent to last answered
  int64_t calls = 0;
  int64_t sequences = 0;             // sequence-steps decoded (calls * batch)
  int64_t kv_bytes = 0;              // K/V bytes attended over (attended_keys of the lengths returned)
  int64_t length_sum = 0;            // sum of the lengths returned
  double server_queue_us = 0;        // means of the server's own timing
  double server_compute_us = 0;
  double server_total_us = 0;
  int64_t errors = 0;
  std::string first_error;
};

// Keys the rows of a sequence of `length` tokens attend: from the first row's
// window start to the end (docs/design.md §9).
int64_t attended_keys(int32_t length, int32_t q_len, int32_t window);

// Mean sequence length over a run's calls.
double mean_context(const RunResult& run, const client::ServerConfig& config);

// Adds `part` (a later run of the same mode) into `total`: latencies, counts,
// wall time, and the server timing means weighted by calls.
void accumulate(RunResult& total, RunResult&& part);

// Runs `shape.clients` threads, each with its own channel to the server.
RunResult run_clients(const client::ConnectionFlags& server, const client::ServerConfig& config,
                      const WorkloadShape& shape, const std::vector<ClientSequences>& seqs,
                      CallMode mode);

}  // namespace pagoda::bench
