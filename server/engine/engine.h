#pragma once
// The batching engine: a FIFO queue per layer and worker threads that drain them.
//
// Handlers validate a request, fill in a work item that points into the
// request's own bytes and the response's buffers, and enqueue it; they never
// compute. A worker takes the oldest layer's head item and coalesces the Decode
// items queued behind it that can share its launch (same q dtype, scale and
// attention variant: window, soft-cap, sinks; in order) up to `max_batch`
// sequences into ONE backend launch, waiting up to `max_batch_wait_us` only for
// calls that are already being validated. Each item's cache reservation (and
// the append of its new K/V) happens in queue order, so pipelined steps of one
// sequence stay exact; in deterministic mode the backend makes every sequence's
// bits independent of its batch. Each worker owns a backend stream and the
// scratch of its launches; the cache's bookkeeping lock is never held across a
// launch, a copy or a K/V write.

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <span>
#include <thread>
#include <vector>

#include "cache/cache_manager.h"
#include "engine/work.h"
#include "observability/metrics.h"
#include "pagoda/backend.h"
#include "pagoda/status.h"

namespace pagoda {

class DeterminismChecker;

// Where the engine reports; each may be null (then nothing is observed there).
struct EngineObservers {
  Metrics* metrics = nullptr;              // stages, batch sizes, bytes read
  DeterminismChecker* checker = nullptr;   // handed sampled sequences of each launch
};

struct EngineOptions {
  int32_t max_batch = 256;               // sequences per launch
  int64_t max_batch_wait_us = 50;
  int32_t workers = 1;                   // each serves any layer not busy with another
  // A Decode that nothing can join (its layer idle, no other call arriving)
  // and this small (cached tokens x KV heads, before its append) runs on the
  // submitting thread: no hand-off to a worker and back. 0: never.
  int64_t inline_max_token_heads = 4096;
  SplitMode mode = SplitMode::kDeterministic;
  int32_t split_tokens = 512;
};

class Engine {
 public:
  // Opens one backend stream per worker and starts the workers.
  static StatusOr<std::unique_ptr<Engine>> create(Backend& backend, CacheManager& cache,
                                                  const EngineOptions& options,
                                                  const EngineObservers& observers = {});
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;
  ~Engine();  // stop()

  // Hand work over; its `done` is called exactly once, possibly before submit
  // returns (on this thread: a small lone Decode, see inline_max_token_heads).
  // After stop() the work completes at once with UNAVAILABLE.
  void submit(DecodeWork* work);
  void submit(AppendWork* work);
  // Runs `work` on the calling thread (its `done` is called before this
  // returns true) when nothing could batch with it: its layer idle, no other
  // call arriving, and small (inline_max_token_heads). False: nothing happened
  // to it; queue() it.
  bool try_run_inline(DecodeWork* work);
  // Queues `work` for a worker without trying it inline (a call
  // try_run_inline has just declined: no second look at the cache).
  void queue(DecodeWork* work);

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
  struct Worker;

  Engine(Backend& backend, CacheManager& cache, const EngineOptions& options, const EngineObservers& observers);
  void enqueue(int32_t layer, Item item);
  void worker_loop(Worker& w);
  // Under mu_: the next batch to run into `batch`, or none (false) to wait until `wake`.
  bool take_batch(Batch& batch, EngineClock::time_point& wake);
  void run_append(Worker& w, AppendWork& work);
  void run_decode_batch(Worker& w, std::vector<Item>& items);
  // The steps of run_decode_batch, each on the worker's own scratch.
  bool reserve_batch(Worker& w, std::vector<Item>& items, EngineClock::time_point start, bool appends);
  void gather_launch(Worker& w, const std::vector<Item>& items, DecodeLaunch& launch, DecodeOutputs& outputs);
  void scatter_results(Worker& w, std::vector<Item>& items, const DecodeLaunch& launch, const DecodeOutputs& outputs,
                       bool ok, double compute_us);
  // After a successful launch, while its reservation still pins the blocks:
  // metrics and determinism samples.
  void observe_launch(Worker& w, const std::vector<Item>& items, const DecodeLaunch& launch,
                      const DecodeOutputs& outputs, double append_seconds);

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
  std::vector<std::unique_ptr<Worker>> workers_;
  std::unique_ptr<Worker> inline_worker_;  // the submitting thread's stream and scratch
  bool inline_busy_ = false;               // under mu_
};

}  // namespace pagoda
