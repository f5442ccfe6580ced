#pragma once
// The live determinism checker (docs/design.md §5 item 5, §6): a sampled fraction of decoded
// sequences is recomputed ALONE (a batch of one) and its output bytes compared with
// what the caller received.
//
// The engine hands a sampled sequence over right after its launch, while the
// launch's reservation still pins the blocks: submit() pins exactly the blocks
// and length the launch read (CacheManager::pin_copy), so a sequence that is
// freed, forked, grown or truncated meanwhile does not change what the
// recomputation reads. The recomputation runs on one low-priority thread with
// its own backend stream, never on the caller's path.
//
// Back-pressure: at most `queue_capacity` checks wait; a sample that finds the
// queue full is skipped: not checked, not counted in
// pagoda_determinism_checks_total, only in stats().skipped (and a debug line).
// Job buffers are allocated once and reused.
//
// A mismatch in deterministic mode is an error (logged with sequence, layer,
// length, chunk_tokens, splits and the largest absolute difference); in fast mode
// the split adapts to the batch, so mismatches are expected and logged at debug.
// Both are counted in pagoda_determinism_mismatches_total{mode}.

#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <thread>
#include <vector>

#include <memory>

#include "cache/cache_manager.h"
#include "observability/metrics.h"
#include "pagoda/backend.h"

namespace pagoda {


struct DeterminismCheckerOptions {
  double sample_rate = 0;  // 0 disables, 1 checks every decoded sequence
  SplitMode mode = SplitMode::kDeterministic;
  int32_t split_tokens = 512;
  size_t queue_capacity = 64;  // checks waiting at most
  int32_t max_rows = 16;       // query rows a checked sequence may have (more: skipped)
};

// One sequence of a finished launch, as the caller received it.
struct DecodedSequence {
  SequenceId id = 0;
  int32_t layer = 0;
  int32_t length = 0;              // tokens cached (after the launch's append)
  int32_t rows = 1;                // its query rows
  const void* q = nullptr;         // [rows, num_q_heads, head_dim] in q_dtype
  DType q_dtype = DType::kFloat32;
  float scale = 0.f;
  int32_t sliding_window = 0;
  float soft_cap = 0.f;
  const float* sinks = nullptr;    // [num_q_heads] or null
  const void* out = nullptr;       // [rows, num_q_heads, v_head_dim] in q_dtype
  const float* lse = nullptr;      // [rows, num_q_heads] or null (not asked for)
  int32_t splits = 0;              // chunks the launch used for this sequence
  int32_t chunk_tokens = 0;        // chunk length of the launch
};

class DeterminismChecker {
 public:
  // `stream` runs the recomputations (may be null when sample_rate is 0).
  DeterminismChecker(std::unique_ptr<BackendStream> stream, CacheManager& cache, Metrics& metrics,
                     const DeterminismCheckerOptions& options);
  DeterminismChecker(const DeterminismChecker&) = delete;
  DeterminismChecker& operator=(const DeterminismChecker&) = delete;
  ~DeterminismChecker();  // stop()

  bool enabled() const { return options_.sample_rate > 0; }
  // Draws whether to check one decoded sequence (thread-safe, no lock).
  bool should_sample() const;
  // Pins what sequence `index` of the launch's reservation `launch` read and
  // queues its check; call while that reservation is alive. Never blocks on a
  // check in progress.
  void submit(const DecodedSequence& decoded, const Reservation& launch, int32_t index);

  // Drops the checks still queued and joins the thread.
  void stop();
  // Tests: waits until every queued check is done.
  void wait_idle();

  struct Stats {
    uint64_t checked = 0;
    uint64_t mismatches = 0;
    uint64_t skipped = 0;  // queue full
  };
  Stats stats() const;

  // Tests: called on each recomputed output before it is compared, so a test can
  // force a mismatch (e.g. flip one bit). Null: no perturbation.
  using Perturbation = void (*)(void* out, size_t bytes);
  void set_perturbation_for_tests(Perturbation perturb) { perturb_.store(perturb); }

 private:
  struct Job {
    Reservation pins;
    DecodedSequence meta;            // pointers re-aimed at the buffers below
    std::vector<std::byte> q;        // [max_rows, num_q_heads, head_dim] in q_dtype
    std::vector<std::byte> out;      // [max_rows, num_q_heads, head_dim] in q_dtype
    std::vector<float> lse;          // [max_rows, num_q_heads]
    std::vector<float> sinks;        // [num_q_heads]
    bool has_lse = false;
  };

  void worker_loop();
  void check(Job& job);

  std::unique_ptr<BackendStream> stream_;
  CacheManager& cache_;
  Metrics& metrics_;
  const DeterminismCheckerOptions options_;
  std::atomic<Perturbation> perturb_{nullptr};

  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::vector<Job> jobs_;          // [queue_capacity], allocated once
  std::vector<size_t> free_jobs_;  // indices of idle jobs
  std::vector<size_t> ring_;       // [queue_capacity] FIFO of queued job indices
  size_t ring_head_ = 0;
  size_t ring_count_ = 0;
  bool busy_ = false;              // the worker is checking a job
  bool stopping_ = false;
  Stats stats_;
  std::thread worker_;

  // The recomputation's outputs, reused (worker thread only).
  std::vector<std::byte> recomputed_out_;
  std::vector<float> recomputed_lse_;
  std::vector<float> want_f32_;
  std::vector<float> got_f32_;
};

}  // namespace pagoda
