#pragma once
// The batching engine: a FIFO queue per layer and worker threads that drain them.
//
// Handlers validate a request, fill in a work item that points into the
// request's own bytes and the response's buffers, and enqueue it; they never
// compute. A worker takes the oldest layer's head item and coalesces the Decode
// items queued behind it (same q dtype and scale, in order) up to `max_batch`
// sequences into ONE backend launch, waiting up to `max_batch_wait_us` only for
// calls that are already being validated. Each item's cache reservation (and
// the append of its new K/V) happens in queue order, so pipelined steps of one
// sequence stay exact; in deterministic mode the backend makes every sequence's
// bits independent of its batch. Only engine workers and the determinism
// checker's one thread call the backend (both backends allow concurrent calls).

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <mutex>
#include <span>
#include <thread>
#include <vector>

#include "cache_manager.h"
#include "metrics.h"
#include "pagoda/backend.h"
#include "pagoda/status.h"

namespace pagoda {

using EngineClock = std::chrono::steady_clock;

// Told once when its work item is done (from an engine worker thread).
class WorkDone {
 public:
  virtual void work_done(const Status& status) = 0;

 protected:
  ~WorkDone() = default;
};

// One Decode request. Inputs point into the request, outputs into the response;
// both stay alive until work_done is called.
struct DecodeWork {
  int32_t layer = 0;
  std::span<const SequenceId> ids;       // [batch], distinct
  const void* q = nullptr;               // [batch, num_q_heads, head_dim]
  DType q_dtype = DType::kFloat32;
  const void* k = nullptr;               // [batch, num_kv_heads, head_dim] or null
  const void* v = nullptr;               // [batch, num_kv_heads, head_dim] or null
  DType kv_dtype = DType::kFloat32;
  float scale = 0.f;                     // resolved: > 0
  void* out = nullptr;                   // [batch, num_q_heads, head_dim], q_dtype
  float* lse = nullptr;                  // [batch, num_q_heads] or null
  int32_t* lengths = nullptr;            // [batch] tokens attended
  int32_t* splits = nullptr;             // [batch] chunks per sequence
  // Filled by the engine:
  int32_t chunk_tokens = 0;
  double queue_us = 0;                   // enqueue -> its batch starts
  double compute_us = 0;                 // the batch's reservation + launch
  EngineClock::time_point enqueued;
  WorkDone* done = nullptr;
  // Set when the caller gave up (cancelled, deadline passed): if the engine has
  // not reserved yet, the item fails with CANCELLED and changes nothing.
  std::atomic<bool> cancelled{false};
};

// One AppendKV request (run alone, in its layer's queue order).
struct AppendWork {
  SequenceId id = 0;
  int32_t layer = 0;
  int32_t num_tokens = 0;
  const void* k = nullptr;               // [num_tokens, num_kv_heads, head_dim]
  const void* v = nullptr;               // [num_tokens, num_kv_heads, head_dim]
  DType dtype = DType::kFloat32;
  int32_t layer_length = 0;              // filled: the layer's length after the append
  WorkDone* done = nullptr;
  std::atomic<bool> cancelled{false};    // as DecodeWork::cancelled
};

class CacheGauges;
class DeterminismChecker;

// Where the engine reports; each may be null (then nothing is observed there).
struct EngineObservers {
  Metrics* metrics = nullptr;              // stages, batch sizes, bytes read
  CacheGauges* cache_gauges = nullptr;     // told after each launch and append
  DeterminismChecker* checker = nullptr;   // handed sampled sequences of each launch
};

struct EngineOptions {
  int32_t max_batch = 256;               // sequences per launch
  int64_t max_batch_wait_us = 50;
  int32_t workers = 1;                   // each serves any layer not busy with another
  SplitMode mode = SplitMode::kDeterministic;
  int32_t split_tokens = 512;
};

class Engine {
 public:
  Engine(Backend& backend, CacheManager& cache, const EngineOptions& options,
         const EngineObservers& observers = {});
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;
  ~Engine();  // stop()

  // Hand work over; its `done` is called exactly once. After stop() the work
  // completes at once with UNAVAILABLE.
  void submit(DecodeWork* work);
  void submit(AppendWork* work);

  // A Decode call has arrived and is being validated (it may submit soon):
  // batching waits for such calls, never for calls that do not exist.
  void note_arriving() { arriving_.fetch_add(1, std::memory_order_relaxed); }
  void note_arrived() { arriving_.fetch_sub(1, std::memory_order_relaxed); }

  // Finishes all queued work, then joins the workers.
  void stop();

  // Holds workers before their next batch (maintenance and tests: work queues
  // up meanwhile); resume() lets them go.
  void pause();
  void resume();
  // Work items queued and not yet taken by a worker.
  size_t queued() const;

  const EngineOptions& options() const { return options_; }

  // Counts since start, for logs and tests.
  struct Counters {
    uint64_t launches = 0;         // backend decode launches
    uint64_t sequences = 0;        // sequences decoded
    int32_t largest_batch = 0;     // most sequences in one launch
  };
  Counters counters() const;

 private:
  struct Item {
    DecodeWork* decode = nullptr;  // exactly one of the two is set
    AppendWork* append = nullptr;
    EngineClock::time_point enqueued;
  };
  struct Batch {
    int32_t layer = -1;
    std::vector<Item> items;
  };

  void enqueue(int32_t layer, Item item);
  void worker_loop();
  // Under mu_: the next batch to run, or an empty batch to wait (until `wake`).
  Batch take_batch(EngineClock::time_point& wake);
  void run_append(AppendWork& work);
  void run_decode_batch(std::vector<Item>& items);
  // After a successful launch, before its leases go: metrics and determinism samples.
  void observe_launch(const std::vector<Item>& items, const DecodeLaunch& launch, const DecodeOutputs& outputs,
                      double append_seconds);

  Backend& backend_;
  CacheManager& cache_;
  const EngineOptions options_;
  const EngineObservers observers_;
  const int32_t num_layers_;

  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::vector<std::deque<Item>> queues_;  // [num_layers]
  std::vector<bool> layer_busy_;          // [num_layers] a worker runs this layer's batch
  size_t queued_ = 0;
  bool paused_ = false;
  bool stopping_ = false;
  std::atomic<int64_t> arriving_{0};
  Counters counters_;  // under mu_
  std::vector<std::thread> workers_;
};

}  // namespace pagoda
