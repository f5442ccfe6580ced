#include "engine.h"

#include <algorithm>
#include <cstring>
#include <utility>

#include <spdlog/spdlog.h>

#include "cache_gauges.h"
#include "determinism_checker.h"

namespace pagoda {
namespace {

double micros_between(EngineClock::time_point a, EngineClock::time_point b) {
  return std::chrono::duration<double, std::micro>(b - a).count();
}

// The inputs and outputs of one coalesced launch, reused by a worker across
// batches so that a warm worker does not allocate.
struct LaunchScratch {
  std::vector<Lease> leases;
  std::vector<size_t> launched;        // indices of the items whose reservation succeeded
  std::vector<int32_t> block_indptr;   // [batch + 1]
  std::vector<int32_t> block_ids;
  std::vector<int32_t> lengths;        // [batch]
  std::vector<std::byte> q;            // [batch, num_q_heads, head_dim] in q dtype
  std::vector<std::byte> out;          // [batch, num_q_heads, head_dim] in q dtype
  std::vector<float> lse;              // [batch, num_q_heads]
  std::vector<int32_t> splits;         // [batch]
};

thread_local LaunchScratch t_scratch;

}  // namespace

Engine::Engine(Backend& backend, CacheManager& cache, const EngineOptions& options,
               const EngineObservers& observers)
    : backend_(backend),
      cache_(cache),
      options_(options),
      observers_(observers),
      num_layers_(backend.geometry().num_layers),
      queues_(static_cast<size_t>(num_layers_)),
      layer_busy_(static_cast<size_t>(num_layers_), false) {
  const int32_t n = std::max(1, options_.workers);
  for (int32_t i = 0; i < n; ++i) workers_.emplace_back([this] { worker_loop(); });
}

Engine::~Engine() { stop(); }

void Engine::submit(DecodeWork* work) {
  work->enqueued = EngineClock::now();
  enqueue(work->layer, Item{work, nullptr, work->enqueued});
}

void Engine::submit(AppendWork* work) {
  enqueue(work->layer, Item{nullptr, work, EngineClock::now()});
}

void Engine::enqueue(int32_t layer, Item item) {
  Status refused;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stopping_) {
      refused = Unavailable("server: shutting down, no new work accepted");
    } else if (layer < 0 || layer >= num_layers_) {
      // Handlers check the layer first; this guards the queue index.
      refused = InvalidArgument("layer: expected [0, {}), received {}", num_layers_, layer);
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
  for (std::thread& t : workers_)
    if (t.joinable()) t.join();
  workers_.clear();
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

Engine::Batch Engine::take_batch(EngineClock::time_point& wake) {
  wake = EngineClock::time_point::max();
  if (paused_) return {};
  // The layer whose head item has waited longest, among layers no worker is running.
  int32_t best = -1;
  for (int32_t l = 0; l < num_layers_; ++l) {
    const auto& q = queues_[static_cast<size_t>(l)];
    if (layer_busy_[static_cast<size_t>(l)] || q.empty()) continue;
    if (best < 0 || q.front().enqueued < queues_[static_cast<size_t>(best)].front().enqueued) best = l;
  }
  if (best < 0) return {};
  auto& q = queues_[static_cast<size_t>(best)];

  Batch batch;
  batch.layer = best;
  if (q.front().append) {
    batch.items.push_back(q.front());
    q.pop_front();
  } else {
    // The run of Decode items one launch can take: same q dtype and scale, in
    // order (stopping at the first that does not fit keeps reservations in order).
    const DecodeWork& head = *q.front().decode;
    size_t n = 0;
    int64_t sequences = 0;
    for (const Item& it : q) {
      if (!it.decode || it.decode->q_dtype != head.q_dtype || it.decode->scale != head.scale) break;
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
        return {};
      }
    }
    batch.items.assign(q.begin(), q.begin() + static_cast<std::ptrdiff_t>(n));
    q.erase(q.begin(), q.begin() + static_cast<std::ptrdiff_t>(n));
  }
  layer_busy_[static_cast<size_t>(best)] = true;
  queued_ -= batch.items.size();
  return batch;
}

void Engine::worker_loop() {
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    if (stopping_ && queued_ == 0) break;
    EngineClock::time_point wake;
    Batch batch = take_batch(wake);
    if (batch.items.empty()) {
      if (wake == EngineClock::time_point::max()) {
        cv_.wait(lock);
      } else {
        cv_.wait_until(lock, wake);
      }
      continue;
    }
    lock.unlock();
    if (batch.items.front().append) {
      run_append(*batch.items.front().append);
    } else {
      run_decode_batch(batch.items);
    }
    lock.lock();
    layer_busy_[static_cast<size_t>(batch.layer)] = false;
    cv_.notify_all();  // this layer may have more work for any worker
  }
}

void Engine::run_append(AppendWork& work) {
  if (work.cancelled.load(std::memory_order_relaxed)) {
    work.done->work_done(Status(StatusCode::kCancelled, "request: cancelled or past its deadline before it ran"));
    return;
  }
  StatusOr<int32_t> length = cache_.append(work.id, work.layer, work.num_tokens, work.k, work.v, work.dtype);
  if (length.ok()) work.layer_length = *length;
  if (observers_.cache_gauges) observers_.cache_gauges->publish();
  work.done->work_done(length.status());
}

void Engine::run_decode_batch(std::vector<Item>& items) {
  const CacheGeometry& g = backend_.geometry();
  const auto start = EngineClock::now();
  LaunchScratch& s = t_scratch;
  s.leases.clear();
  s.launched.clear();
  bool appends = false;

  // Reserve (and append) item by item in queue order; a failed item changes
  // nothing and is answered at once.
  for (size_t i = 0; i < items.size(); ++i) {
    DecodeWork& d = *items[i].decode;
    d.queue_us = micros_between(d.enqueued, start);
    if (observers_.metrics) observers_.metrics->observe_stage(DecodeStage::kQueue, d.queue_us * 1e-6);
    if (d.cancelled.load(std::memory_order_relaxed)) {
      d.done->work_done(Status(StatusCode::kCancelled, "request: cancelled or past its deadline before it ran"));
      continue;
    }
    AppendRows rows;
    const AppendRows* append = nullptr;
    if (d.k != nullptr) {
      rows.tokens_per_sequence = 1;
      rows.k = d.k;
      rows.v = d.v;
      rows.dtype = d.kv_dtype;
      append = &rows;
      appends = true;
    }
    StatusOr<Lease> lease = cache_.acquire(d.layer, d.ids, append);
    if (!lease.ok()) {
      d.compute_us = micros_between(start, EngineClock::now());
      d.done->work_done(lease.status());
      continue;
    }
    s.launched.push_back(i);
    s.leases.push_back(std::move(*lease));
  }
  if (s.launched.empty()) {
    if (appends && observers_.cache_gauges) observers_.cache_gauges->publish();
    return;
  }
  const double append_seconds = appends ? micros_between(start, EngineClock::now()) * 1e-6 : 0.0;

  // One CSR block table for the whole batch.
  s.block_indptr.assign(1, 0);
  s.block_ids.clear();
  s.lengths.clear();
  for (const Lease& lease : s.leases) {
    const int32_t base = s.block_indptr.back();
    for (size_t b = 1; b < lease.block_indptr().size(); ++b) s.block_indptr.push_back(base + lease.block_indptr()[b]);
    s.block_ids.insert(s.block_ids.end(), lease.block_ids().begin(), lease.block_ids().end());
    s.lengths.insert(s.lengths.end(), lease.lengths().begin(), lease.lengths().end());
  }
  const auto batch = static_cast<int32_t>(s.lengths.size());
  const DecodeWork& head = *items[s.launched.front()].decode;
  const size_t row_bytes = static_cast<size_t>(g.num_q_heads) * g.head_dim * dtype_size(head.q_dtype);
  const size_t lse_row = static_cast<size_t>(g.num_q_heads);

  DecodeLaunch launch;
  launch.layer = head.layer;
  launch.tables.batch = batch;
  launch.tables.block_indptr = s.block_indptr.data();
  launch.tables.block_ids = s.block_ids.data();
  launch.tables.lengths = s.lengths.data();
  launch.q_dtype = head.q_dtype;
  launch.scale = head.scale;
  launch.mode = options_.mode;
  launch.split_tokens = options_.split_tokens;
  DecodeOutputs outputs;

  // A lone request reads its q and writes its results in place; a coalesced
  // batch goes through contiguous scratch.
  const bool alone = s.launched.size() == 1;
  if (alone) {
    launch.q = head.q;
    outputs.out = head.out;
    outputs.lse = head.lse;
    outputs.splits = head.splits;
  } else {
    s.q.resize(row_bytes * static_cast<size_t>(batch));
    s.out.resize(row_bytes * static_cast<size_t>(batch));
    s.lse.resize(lse_row * static_cast<size_t>(batch));
    s.splits.resize(static_cast<size_t>(batch));
    size_t row = 0;
    for (size_t i : s.launched) {
      const DecodeWork& d = *items[i].decode;
      std::memcpy(s.q.data() + row * row_bytes, d.q, d.ids.size() * row_bytes);
      row += d.ids.size();
    }
    launch.q = s.q.data();
    outputs.out = s.out.data();
    outputs.lse = s.lse.data();
    outputs.splits = s.splits.data();
  }
  const Status status = backend_.decode(launch, outputs);
  {
    std::lock_guard<std::mutex> lock(mu_);
    ++counters_.launches;
    counters_.sequences += static_cast<uint64_t>(batch);
    counters_.largest_batch = std::max(counters_.largest_batch, batch);
  }
  if (status.ok()) observe_launch(items, launch, outputs, append_seconds);
  s.leases.clear();  // blocks are unpinned before anyone is told
  if (observers_.cache_gauges) observers_.cache_gauges->publish();
  const double compute_us = micros_between(start, EngineClock::now());
  spdlog::trace("engine: layer {} launch of {} requests, {} sequences, {:.1f} us", head.layer, s.launched.size(),
                batch, compute_us);
  if (!status.ok()) {
    spdlog::error("engine: backend decode of {} sequences on layer {} failed: {}", batch, head.layer,
                  status.message());
  }

  size_t row = 0;
  for (size_t i : s.launched) {
    DecodeWork& d = *items[i].decode;
    const size_t n = d.ids.size();
    if (status.ok()) {
      if (!alone) {
        std::memcpy(d.out, s.out.data() + row * row_bytes, n * row_bytes);
        if (d.lse) std::memcpy(d.lse, s.lse.data() + row * lse_row, n * lse_row * sizeof(float));
        std::memcpy(d.splits, s.splits.data() + row, n * sizeof(int32_t));
      }
      std::memcpy(d.lengths, s.lengths.data() + row, n * sizeof(int32_t));
      d.chunk_tokens = outputs.chunk_tokens;
    }
    d.compute_us = compute_us;
    row += n;
    d.done->work_done(status);
  }
}

void Engine::observe_launch(const std::vector<Item>& items, const DecodeLaunch& launch, const DecodeOutputs& outputs,
                            double append_seconds) {
  LaunchScratch& s = t_scratch;
  const CacheGeometry& g = backend_.geometry();
  if (Metrics* m = observers_.metrics) {
    if (append_seconds > 0) m->observe_stage(DecodeStage::kAppend, append_seconds);
    m->observe_stage(DecodeStage::kAttention, std::max(0.0, outputs.attention_seconds - outputs.merge_seconds));
    m->observe_stage(DecodeStage::kMerge, outputs.merge_seconds);
    if (outputs.transfer_seconds > 0) m->observe_stage(DecodeStage::kTransfer, outputs.transfer_seconds);
    m->observe_batch(s.lengths);
    int64_t tokens = 0;
    for (int32_t length : s.lengths) tokens += length;
    m->add_kv_read(static_cast<double>(tokens) * static_cast<double>(g.token_kv_bytes()), outputs.attention_seconds);
  }
  DeterminismChecker* checker = observers_.checker;
  if (checker == nullptr || !checker->enabled()) return;
  // The launch's leases are alive here, so a sampled sequence's blocks are still pinned.
  const size_t row_bytes = static_cast<size_t>(g.num_q_heads) * g.head_dim * dtype_size(launch.q_dtype);
  const size_t lse_row = static_cast<size_t>(g.num_q_heads);
  size_t row = 0;
  for (size_t i : s.launched) {
    const DecodeWork& d = *items[i].decode;
    for (SequenceId id : d.ids) {
      if (checker->should_sample()) {
        DecodedSequence seq;
        seq.id = id;
        seq.layer = launch.layer;
        seq.length = s.lengths[row];
        seq.q = static_cast<const std::byte*>(launch.q) + row * row_bytes;
        seq.q_dtype = launch.q_dtype;
        seq.scale = launch.scale;
        seq.out = static_cast<const std::byte*>(outputs.out) + row * row_bytes;
        seq.lse = outputs.lse ? outputs.lse + row * lse_row : nullptr;
        seq.splits = outputs.splits ? outputs.splits[row] : 0;
        seq.chunk_tokens = outputs.chunk_tokens;
        checker->submit(seq);
      }
      ++row;
    }
  }
}

}  // namespace pagoda
