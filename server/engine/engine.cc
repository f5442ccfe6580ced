#include "engine/engine.h"

#include <algorithm>
#include <cassert>
#include <cstring>
#include <utility>

#include <spdlog/spdlog.h>

#include "engine/determinism_checker.h"

namespace pagoda {
namespace {

double micros_between(EngineClock::time_point a, EngineClock::time_point b) {
  return std::chrono::duration<double, std::micro>(b - a).count();
}

// Whether two Decode items can share one launch: its q dtype, scale and
// attention variant (window, soft-cap, sinks) are per launch.
bool same_launch(const DecodeWork& a, const DecodeWork& b, int32_t num_q_heads) {
  if (a.q_dtype != b.q_dtype || a.scale != b.scale || a.sliding_window != b.sliding_window ||
      a.soft_cap != b.soft_cap || (a.sinks == nullptr) != (b.sinks == nullptr)) {
    return false;
  }
  return a.sinks == nullptr || std::memcmp(a.sinks, b.sinks, static_cast<size_t>(num_q_heads) * sizeof(float)) == 0;
}

}  // namespace

// A worker: its thread, its backend stream, and the inputs and outputs of its
// launches, reused across batches so that a warm worker does not allocate.
struct Engine::Worker {
  std::unique_ptr<BackendStream> stream;
  std::thread thread;
  Batch batch;
  Reservation reservation;          // the batch's pins, slots and copies
  std::vector<size_t> launched;     // indices of the items whose reservation succeeded
  std::vector<KvSource> sources;    // [parts] where each launched item's new rows come from
  std::vector<std::byte> q;         // [rows, num_q_heads, head_dim] in q dtype
  std::vector<std::byte> out;       // [rows, num_q_heads, v_head_dim] in q dtype
  std::vector<float> lse;           // [rows, num_q_heads]
  std::vector<int32_t> splits;      // [batch]
  std::vector<int32_t> q_indptr;    // [batch + 1] query rows per sequence
  std::vector<float> sinks;         // [num_q_heads], aligned
};

StatusOr<std::unique_ptr<Engine>> Engine::create(Backend& backend, CacheManager& cache, const EngineOptions& options,
                                                 const EngineObservers& observers) {
  std::unique_ptr<Engine> engine(new Engine(backend, cache, options, observers));
  const int32_t n = std::max(1, options.workers);
  for (int32_t i = 0; i < n; ++i) {
    auto w = std::make_unique<Worker>();
    StatusOr<std::unique_ptr<BackendStream>> stream = backend.open_stream();
    if (!stream.ok()) {
      engine->stop();
      return stream.status();
    }
    w->stream = std::move(*stream);
    engine->workers_.push_back(std::move(w));
  }
  if (options.inline_max_token_heads > 0) {
    auto w = std::make_unique<Worker>();
    StatusOr<std::unique_ptr<BackendStream>> stream = backend.open_stream();
    if (!stream.ok()) {
      engine->stop();
      return stream.status();
    }
    w->stream = std::move(*stream);
    engine->inline_worker_ = std::move(w);
  }
  for (auto& w : engine->workers_) {
    Worker* worker = w.get();
    worker->thread = std::thread([e = engine.get(), worker] { e->worker_loop(*worker); });
  }
  return engine;
}

Engine::Engine(Backend& backend, CacheManager& cache, const EngineOptions& options,
               const EngineObservers& observers)
    : backend_(backend),
      cache_(cache),
      options_(options),
      observers_(observers),
      num_layers_(backend.geometry().num_layers),
      queues_(static_cast<size_t>(num_layers_)),
      layer_busy_(static_cast<size_t>(num_layers_), false) {}

Engine::~Engine() { stop(); }

void Engine::submit(DecodeWork* work) {
  if (!try_run_inline(work)) queue(work);
}

void Engine::queue(DecodeWork* work) {
  work->enqueued = EngineClock::now();
  enqueue(work->layer, Item{work, nullptr, work->enqueued});
}

bool Engine::try_run_inline(DecodeWork* work) {
  if (!inline_worker_) return false;
  work->enqueued = EngineClock::now();
  const auto layer = static_cast<size_t>(work->layer);
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stopping_ || paused_ || inline_busy_ || layer_busy_[layer] || !queues_[layer].empty() ||
        arriving_.load(std::memory_order_relaxed) > 0) {
      return false;
    }
    inline_busy_ = true;
    layer_busy_[layer] = true;
  }
  // Small enough? The lengths come from the cache (one short lock); a call
  // that grew meanwhile only runs a little longer here.
  const int64_t token_heads = cache_.cached_tokens(work->layer, work->ids) * backend_.geometry().num_kv_heads;
  const bool small = token_heads <= options_.inline_max_token_heads;
  if (small) {
    std::vector<Item>& items = inline_worker_->batch.items;
    items.assign(1, Item{work, nullptr, work->enqueued});
    run_decode_batch(*inline_worker_, items);
  }
  bool queued_meanwhile = false;
  {
    std::lock_guard<std::mutex> lock(mu_);
    inline_busy_ = false;
    layer_busy_[layer] = false;
    queued_meanwhile = !queues_[layer].empty();
  }
  // Wake a worker only for work this layer queued meanwhile (waking one for
  // nothing costs two context switches per call).
  if (queued_meanwhile) cv_.notify_all();
  return small;
}

void Engine::submit(AppendWork* work) {
  enqueue(work->layer, Item{nullptr, work, EngineClock::now()});
}

void Engine::enqueue(int32_t layer, Item item) {
  Status refused;
  {
    std::lock_guard<std::mutex> lock(mu_);
    assert(layer >= 0 && layer < num_layers_ && "the rpc layer validates the layer");
    if (stopping_) {
      refused = Unavailable("server: shutting down, no new work accepted");
    } else {
      queues_[static_cast<size_t>(layer)].push_back(item);
      ++queued_;
      cv_.notify_one();
      return;
    }
  }
  if (item.decode) item.decode->done->work_done(refused);
  if (item.append) item.append->done->work_done(refused);
}

void Engine::stop() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
    paused_ = false;
  }
  cv_.notify_all();
  for (auto& w : workers_)
    if (w->thread.joinable()) w->thread.join();
}

void Engine::pause() {
  std::lock_guard<std::mutex> lock(mu_);
  paused_ = true;
}

void Engine::resume() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    paused_ = false;
  }
  cv_.notify_all();
}

Engine::Counters Engine::counters() const {
  std::lock_guard<std::mutex> lock(mu_);
  return counters_;
}

size_t Engine::queued() const {
  std::lock_guard<std::mutex> lock(mu_);
  return queued_;
}

bool Engine::take_batch(Batch& batch, EngineClock::time_point& wake) {
  wake = EngineClock::time_point::max();
  batch.items.clear();
  if (paused_) return false;
  // The layer whose head item has waited longest, among layers no worker is running.
  int32_t best = -1;
  for (int32_t l = 0; l < num_layers_; ++l) {
    const auto& q = queues_[static_cast<size_t>(l)];
    if (layer_busy_[static_cast<size_t>(l)] || q.empty()) continue;
    if (best < 0 || q.front().enqueued < queues_[static_cast<size_t>(best)].front().enqueued) best = l;
  }
  if (best < 0) return false;
  auto& q = queues_[static_cast<size_t>(best)];

  batch.layer = best;
  if (q.front().append) {
    batch.items.push_back(q.front());
    q.pop_front();
  } else {
    // The run of Decode items one launch can take (same_launch: q dtype, scale and variant), in
    // order (stopping at the first that does not fit keeps reservations in order).
    const DecodeWork& head = *q.front().decode;
    size_t n = 0;
    int64_t sequences = 0;
    for (const Item& it : q) {
      if (!it.decode || !same_launch(*it.decode, head, backend_.geometry().num_q_heads)) break;
      const auto b = static_cast<int64_t>(it.decode->ids.size());
      if (n > 0 && sequences + b > options_.max_batch) break;
      sequences += b;
      ++n;
    }
    const bool room_left = n == q.size() && sequences < options_.max_batch;
    if (room_left && options_.max_batch_wait_us > 0 && arriving_.load(std::memory_order_relaxed) > 0) {
      const auto deadline = q.front().enqueued + std::chrono::microseconds(options_.max_batch_wait_us);
      if (EngineClock::now() < deadline) {
        wake = deadline;
        return false;
      }
    }
    batch.items.assign(q.begin(), q.begin() + static_cast<std::ptrdiff_t>(n));
    q.erase(q.begin(), q.begin() + static_cast<std::ptrdiff_t>(n));
  }
  layer_busy_[static_cast<size_t>(best)] = true;
  queued_ -= batch.items.size();
  return true;
}

void Engine::worker_loop(Worker& w) {
  std::unique_lock<std::mutex> lock(mu_);
  Batch& batch = w.batch;
  for (;;) {
    if (stopping_ && queued_ == 0) break;
    EngineClock::time_point wake;
    if (!take_batch(batch, wake)) {
      if (wake == EngineClock::time_point::max()) {
        cv_.wait(lock);
      } else {
        cv_.wait_until(lock, wake);
      }
      continue;
    }
    lock.unlock();
    if (batch.items.front().append) {
      run_append(w, *batch.items.front().append);
    } else {
      run_decode_batch(w, batch.items);
    }
    lock.lock();
    layer_busy_[static_cast<size_t>(batch.layer)] = false;
    cv_.notify_all();  // this layer may have more work for any worker
  }
}

void Engine::run_append(Worker& w, AppendWork& work) {
  if (Status refused = refusal(work); !refused.ok()) {
    work.done->work_done(refused);
    return;
  }
  StatusOr<int32_t> length =
      cache_.append(*w.stream, work.id, work.layer, work.num_tokens, work.k, work.v, work.dtype, work.expected_length,
                    work.tenant);
  if (length.ok()) work.layer_length = *length;
  work.done->work_done(length.status());
}

// Reserves item by item in queue order (each sees the lengths the ones before
// it leave); a failed item changes nothing and is answered at once. Then the
// copies, K/V writes and the commit, outside the cache's lock. False: nothing
// to launch (every item answered).
bool Engine::reserve_batch(Worker& w, std::vector<Item>& items, EngineClock::time_point start, bool appends) {
  w.launched.clear();
  w.sources.clear();
  Reservation& r = w.reservation;
  cache_.begin(items.front().decode->layer, appends, r);
  for (size_t i = 0; i < items.size(); ++i) {
    DecodeWork& d = *items[i].decode;
    d.queue_us = micros_between(d.enqueued, start);
    if (observers_.metrics) observers_.metrics->observe_stage(DecodeStage::kQueue, d.queue_us * 1e-6);
    if (Status refused = refusal(d); !refused.ok()) {
      d.done->work_done(refused);
      continue;
    }
    ReserveRequest request;
    request.tenant = d.tenant;
    request.ids = d.ids;
    if (d.k != nullptr) {
      request.new_tokens = d.q_lengths;  // one new token per query row
      request.new_tokens_each = 1;
    }
    request.query_rows = d.q_lengths;
    request.expected_lengths = d.expected_lengths;
    if (const Status status = cache_.reserve(r, request); !status.ok()) {
      d.compute_us = micros_between(start, EngineClock::now());
      d.done->work_done(status);
      continue;
    }
    w.launched.push_back(i);
    w.sources.push_back({d.k, d.v, d.kv_dtype});
  }
  Status status;
  if (appends && !w.launched.empty()) status = cache_.finish(r, *w.stream, w.sources);
  if (!w.launched.empty() && status.ok()) return true;
  r.release();  // an append that did not commit rolls back whole
  if (!status.ok()) {
    spdlog::error("engine: K/V write of {} requests on layer {} failed: {}", w.launched.size(), r.layer(),
                  status.message());
  }
  for (size_t i : w.launched) {
    DecodeWork& d = *items[i].decode;
    d.compute_us = micros_between(start, EngineClock::now());
    d.done->work_done(status);
  }
  return false;
}

// The launch of the reserved items: their tables, the variant of the head
// item (take_batch joined only items that share it), the query rows per
// sequence, and where q comes from and results go: a lone request in place, a
// coalesced batch through the worker's contiguous scratch.
void Engine::gather_launch(Worker& w, const std::vector<Item>& items, DecodeLaunch& launch, DecodeOutputs& outputs) {
  const CacheGeometry& g = backend_.geometry();
  const Reservation& r = w.reservation;
  const DecodeWork& head = *items[w.launched.front()].decode;
  const size_t row_bytes = static_cast<size_t>(g.num_q_heads) * g.head_dim * dtype_size(head.q_dtype);
  const size_t out_row_bytes = static_cast<size_t>(g.num_q_heads) * g.v_dim() * dtype_size(head.q_dtype);
  launch.layer = r.layer();
  launch.tables = r.tables();
  launch.q_dtype = head.q_dtype;
  launch.scale = head.scale;
  launch.sliding_window = head.sliding_window;
  launch.soft_cap = head.soft_cap;
  launch.mode = options_.mode;
  launch.split_tokens = options_.split_tokens;
  if (head.sinks != nullptr) {
    w.sinks.resize(static_cast<size_t>(g.num_q_heads));
    std::memcpy(w.sinks.data(), head.sinks, w.sinks.size() * sizeof(float));
    launch.sinks = w.sinks.data();
  }
  int32_t rows = 0;
  bool multi = false;
  for (size_t i : w.launched) {
    rows += items[i].decode->rows;
    multi |= !items[i].decode->q_lengths.empty();
  }
  if (multi) {
    w.q_indptr.assign(1, 0);
    for (size_t i : w.launched) {
      const DecodeWork& d = *items[i].decode;
      for (size_t b = 0; b < d.ids.size(); ++b) {
        w.q_indptr.push_back(w.q_indptr.back() + (d.q_lengths.empty() ? 1 : d.q_lengths[b]));
      }
    }
    launch.q_indptr = w.q_indptr.data();
  }
  if (w.launched.size() == 1) {
    launch.q = head.q;
    outputs.out = head.out;
    outputs.lse = head.lse;
    outputs.splits = head.splits;
    return;
  }
  w.q.resize(row_bytes * static_cast<size_t>(rows));
  w.out.resize(out_row_bytes * static_cast<size_t>(rows));
  w.lse.resize(static_cast<size_t>(g.num_q_heads) * static_cast<size_t>(rows));
  w.splits.resize(static_cast<size_t>(r.batch()));
  size_t row = 0;
  for (size_t i : w.launched) {
    const DecodeWork& d = *items[i].decode;
    std::memcpy(w.q.data() + row * row_bytes, d.q, static_cast<size_t>(d.rows) * row_bytes);
    row += static_cast<size_t>(d.rows);
  }
  launch.q = w.q.data();
  outputs.out = w.out.data();
  outputs.lse = w.lse.data();
  outputs.splits = w.splits.data();
}

// Each launched item's results: out of the worker's scratch (a coalesced
// batch), lengths and chunk length, the batch's compute time.
void Engine::scatter_results(Worker& w, std::vector<Item>& items, const DecodeLaunch& launch,
                             const DecodeOutputs& outputs, bool ok, double compute_us) {
  const CacheGeometry& g = backend_.geometry();
  const size_t row_bytes = static_cast<size_t>(g.num_q_heads) * g.v_dim() * dtype_size(launch.q_dtype);  // output rows
  const size_t lse_row = static_cast<size_t>(g.num_q_heads);
  const bool alone = w.launched.size() == 1;
  const std::span<const int32_t> lengths = w.reservation.lengths();
  size_t row = 0;  // query rows
  size_t seq = 0;  // sequences
  for (size_t i : w.launched) {
    DecodeWork& d = *items[i].decode;
    const size_t n = d.ids.size();
    const auto rows_of_d = static_cast<size_t>(d.rows);
    if (ok) {
      if (!alone) {
        std::memcpy(d.out, w.out.data() + row * row_bytes, rows_of_d * row_bytes);
        if (d.lse) std::memcpy(d.lse, w.lse.data() + row * lse_row, rows_of_d * lse_row * sizeof(float));
        std::memcpy(d.splits, w.splits.data() + seq, n * sizeof(int32_t));
      }
      std::memcpy(d.lengths, lengths.data() + seq, n * sizeof(int32_t));
      d.chunk_tokens = outputs.chunk_tokens;
    }
    d.compute_us = compute_us;
    row += rows_of_d;
    seq += n;
  }
}

// One batch: reserve (and append), gather, launch, observe, scatter; the
// reservation is released (blocks unpinned) before any caller is told.
void Engine::run_decode_batch(Worker& w, std::vector<Item>& items) {
  const auto start = EngineClock::now();
  const bool appends = std::any_of(items.begin(), items.end(), [](const Item& it) { return it.decode->k != nullptr; });
  if (!reserve_batch(w, items, start, appends)) return;
  const double append_seconds = appends ? micros_between(start, EngineClock::now()) * 1e-6 : 0.0;
  DecodeLaunch launch;
  DecodeOutputs outputs;
  gather_launch(w, items, launch, outputs);
  const Status status = w.stream->decode(launch, outputs);
  const int32_t batch = w.reservation.batch();
  {
    std::lock_guard<std::mutex> lock(mu_);
    ++counters_.launches;
    counters_.sequences += static_cast<uint64_t>(batch);
    counters_.largest_batch = std::max(counters_.largest_batch, batch);
  }
  if (status.ok()) observe_launch(w, items, launch, outputs, append_seconds);
  const double compute_us = micros_between(start, EngineClock::now());
  spdlog::trace("engine: layer {} launch of {} requests, {} sequences, {:.1f} us", launch.layer, w.launched.size(),
                batch, compute_us);
  if (!status.ok()) {
    spdlog::error("engine: backend decode of {} sequences on layer {} failed: {}", batch, launch.layer,
                  status.message());
  }
  scatter_results(w, items, launch, outputs, status.ok(), compute_us);
  w.reservation.release();  // blocks are unpinned (and the cache reports what changed) before anyone is told
  for (size_t i : w.launched) items[i].decode->done->work_done(status);
}

void Engine::observe_launch(Worker& w, const std::vector<Item>& items, const DecodeLaunch& launch,
                            const DecodeOutputs& outputs, double append_seconds) {
  const CacheGeometry& g = backend_.geometry();
  const std::span<const int32_t> lengths = w.reservation.lengths();
  if (Metrics* m = observers_.metrics) {
    if (append_seconds > 0) m->observe_stage(DecodeStage::kAppend, append_seconds);
    m->observe_stage(DecodeStage::kAttention, std::max(0.0, outputs.attention_seconds - outputs.merge_seconds));
    m->observe_stage(DecodeStage::kMerge, outputs.merge_seconds);
    if (outputs.transfer_seconds > 0) m->observe_stage(DecodeStage::kTransfer, outputs.transfer_seconds);
    m->observe_batch(lengths);
    m->add_kv_read(static_cast<double>(outputs.kv_bytes_read), static_cast<double>(outputs.kv_bytes_shared),
                   outputs.attention_seconds);
  }
  DeterminismChecker* checker = observers_.checker;
  if (checker == nullptr || !checker->enabled()) return;
  // The launch's reservation is alive here, so a sampled sequence's blocks are still pinned.
  const size_t row_bytes = static_cast<size_t>(g.num_q_heads) * g.head_dim * dtype_size(launch.q_dtype);
  const size_t out_row_bytes = static_cast<size_t>(g.num_q_heads) * g.v_dim() * dtype_size(launch.q_dtype);
  const size_t lse_row = static_cast<size_t>(g.num_q_heads);
  int32_t seq_index = 0;
  for (size_t i : w.launched) {
    const DecodeWork& d = *items[i].decode;
    for (SequenceId id : d.ids) {
      if (checker->should_sample()) {
        const auto row = static_cast<size_t>(launch.first_row(seq_index));
        DecodedSequence seq;
        seq.id = id;
        seq.layer = launch.layer;
        seq.length = lengths[static_cast<size_t>(seq_index)];
        seq.rows = launch.rows_of(seq_index);
        seq.q = static_cast<const std::byte*>(launch.q) + row * row_bytes;
        seq.q_dtype = launch.q_dtype;
        seq.scale = launch.scale;
        seq.sliding_window = launch.sliding_window;
        seq.soft_cap = launch.soft_cap;
        seq.sinks = launch.sinks;
        seq.out = static_cast<const std::byte*>(outputs.out) + row * out_row_bytes;
        seq.lse = outputs.lse ? outputs.lse + row * lse_row : nullptr;
        seq.splits = outputs.splits ? outputs.splits[seq_index] : 0;
        seq.chunk_tokens = outputs.chunk_tokens;
        checker->submit(seq, w.reservation, seq_index);
      }
      ++seq_index;
    }
  }
}

}  // namespace pagoda
