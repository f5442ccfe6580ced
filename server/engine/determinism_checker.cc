#include "engine/determinism_checker.h"

#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <iterator>
#include <cmath>
#include <cstring>
#include <functional>

#include <spdlog/spdlog.h>

#include "pagoda/host_convert.h"

namespace pagoda {
namespace {

// A uniform draw in [0, 1) from a per-thread splitmix64 stream: no lock, no allocation.
double uniform01() {
  thread_local uint64_t state =
      std::hash<std::thread::id>{}(std::this_thread::get_id()) ^ 0x9e3779b97f4a7c15ull;
  uint64_t z = (state += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  z ^= z >> 31;
  return static_cast<double>(z >> 11) * 0x1.0p-53;
}

}  // namespace

DeterminismChecker::DeterminismChecker(std::unique_ptr<BackendStream> stream, CacheManager& cache, Metrics& metrics,
                                       const DeterminismCheckerOptions& options)
    : stream_(std::move(stream)), cache_(cache), metrics_(metrics), options_(options) {
  if (!enabled() || stream_ == nullptr) return;
  const CacheGeometry& g = cache.geometry();
  const size_t capacity = std::max<size_t>(1, options_.queue_capacity);
  // Sized for the widest q dtype (fp32) and max_rows rows, so a job never grows
  // (q rows are head_dim wide, output rows v_head_dim <= head_dim).
  const auto rows = static_cast<size_t>(std::max(1, options_.max_rows));
  const size_t row_bytes = static_cast<size_t>(g.num_q_heads) * g.head_dim * sizeof(float) * rows;
  jobs_.resize(capacity);
  for (Job& job : jobs_) {
    job.q.resize(row_bytes);
    job.out.resize(row_bytes);
    job.lse.resize(static_cast<size_t>(g.num_q_heads) * rows);
    job.sinks.resize(static_cast<size_t>(g.num_q_heads));
  }
  free_jobs_.reserve(capacity);
  for (size_t i = capacity; i-- > 0;) free_jobs_.push_back(i);
  ring_.resize(capacity);
  recomputed_out_.resize(row_bytes);
  recomputed_lse_.resize(static_cast<size_t>(g.num_q_heads) * rows);
  want_f32_.resize(static_cast<size_t>(g.num_q_heads) * g.head_dim * rows);
  got_f32_.resize(want_f32_.size());
  worker_ = std::thread([this] { worker_loop(); });
}

DeterminismChecker::~DeterminismChecker() { stop(); }

bool DeterminismChecker::should_sample() const {
  if (options_.sample_rate >= 1) return true;
  if (options_.sample_rate <= 0) return false;
  return uniform01() < options_.sample_rate;
}

void DeterminismChecker::submit(const DecodedSequence& decoded, const Reservation& launch, int32_t index) {
  size_t index_of_job = 0;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stopping_ || !worker_.joinable()) return;
    if (decoded.rows > options_.max_rows) {
      ++stats_.skipped;
      spdlog::debug("determinism check of sequence_id={} layer={} skipped: {} query rows (checks take up to {})",
                    decoded.id, decoded.layer, decoded.rows, options_.max_rows);
      return;
    }
    if (free_jobs_.empty()) {
      ++stats_.skipped;
      spdlog::debug("determinism check of sequence_id={} layer={} skipped: {} checks already queued", decoded.id,
                    decoded.layer, jobs_.size());
      return;
    }
    index_of_job = free_jobs_.back();
    free_jobs_.pop_back();
  }
  Job& job = jobs_[index_of_job];
  // The launch's own reservation still pins these blocks, so this is what it read.
  cache_.pin_copy(launch, index, job.pins);
  const CacheGeometry& g = cache_.geometry();
  const size_t cells = static_cast<size_t>(decoded.rows) * g.num_q_heads;
  const size_t lse_count = cells;
  job.meta = decoded;
  std::memcpy(job.q.data(), decoded.q, cells * g.head_dim * dtype_size(decoded.q_dtype));
  std::memcpy(job.out.data(), decoded.out, cells * g.v_dim() * dtype_size(decoded.q_dtype));
  job.has_lse = decoded.lse != nullptr;
  if (job.has_lse) std::memcpy(job.lse.data(), decoded.lse, lse_count * sizeof(float));
  if (decoded.sinks != nullptr) std::copy_n(decoded.sinks, job.sinks.size(), job.sinks.begin());
  job.meta.q = job.q.data();
  job.meta.out = job.out.data();
  job.meta.lse = job.has_lse ? job.lse.data() : nullptr;
  job.meta.sinks = decoded.sinks != nullptr ? job.sinks.data() : nullptr;
  std::lock_guard<std::mutex> lock(mu_);
  if (stopping_) {  // stopped meanwhile: the pins go now
    job.pins.release();
    free_jobs_.push_back(index_of_job);
    return;
  }
  ring_[(ring_head_ + ring_count_) % ring_.size()] = index_of_job;
  ++ring_count_;
  cv_.notify_all();
}

void DeterminismChecker::stop() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  if (worker_.joinable()) worker_.join();
  // Queued checks are dropped; their pins go with them.
  for (Job& job : jobs_) job.pins.release();
}

void DeterminismChecker::wait_idle() {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait(lock, [this] { return stopping_ || (ring_count_ == 0 && !busy_); });
}

DeterminismChecker::Stats DeterminismChecker::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  return stats_;
}

void DeterminismChecker::worker_loop() {
  // Lowest CPU priority for this thread: a check yields to the engine's launches.
  setpriority(PRIO_PROCESS, static_cast<id_t>(syscall(SYS_gettid)), 19);
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    cv_.wait(lock, [this] { return stopping_ || ring_count_ > 0; });
    if (stopping_) break;
    const size_t index = ring_[ring_head_];
    ring_head_ = (ring_head_ + 1) % ring_.size();
    --ring_count_;
    busy_ = true;
    lock.unlock();
    check(jobs_[index]);
    jobs_[index].pins.release();
      lock.lock();
    busy_ = false;
    free_jobs_.push_back(index);
    cv_.notify_all();
  }
}

void DeterminismChecker::check(Job& job) {
  const CacheGeometry& g = cache_.geometry();
  const DecodedSequence& m = job.meta;
  const auto elems = static_cast<int64_t>(m.rows) * g.num_q_heads * g.v_dim();  // of the output
  const size_t row_bytes = static_cast<size_t>(elems) * dtype_size(m.q_dtype);
  const size_t lse_count = static_cast<size_t>(m.rows) * g.num_q_heads;

  const int32_t q_indptr[2] = {0, m.rows};
  DecodeLaunch launch;
  launch.layer = m.layer;
  launch.tables = job.pins.tables();
  launch.q_indptr = q_indptr;
  launch.q = m.q;
  launch.q_dtype = m.q_dtype;
  launch.scale = m.scale;
  launch.sliding_window = m.sliding_window;
  launch.soft_cap = m.soft_cap;
  launch.sinks = m.sinks;
  launch.mode = options_.mode;
  launch.split_tokens = options_.split_tokens;
  int32_t splits = 0;
  DecodeOutputs outputs;
  outputs.out = recomputed_out_.data();
  outputs.lse = recomputed_lse_.data();
  outputs.splits = &splits;
  const Status status = stream_->decode(launch, outputs);
  if (!status.ok()) {
    spdlog::error("determinism check of sequence_id={} layer={} length={} could not recompute: {}", m.id, m.layer,
                  m.length, status.message());
    return;
  }
  if (Perturbation perturb = perturb_.load()) perturb(recomputed_out_.data(), row_bytes);

  bool mismatch = std::memcmp(recomputed_out_.data(), m.out, row_bytes) != 0;
  if (m.lse) mismatch |= std::memcmp(recomputed_lse_.data(), m.lse, lse_count * sizeof(float)) != 0;
  double max_abs_diff = 0;
  if (mismatch) {
    convert_to_float(m.out, m.q_dtype, want_f32_.data(), elems);
    convert_to_float(recomputed_out_.data(), m.q_dtype, got_f32_.data(), elems);
    for (int64_t i = 0; i < elems; ++i) {
      const double d = std::fabs(static_cast<double>(want_f32_[i]) - static_cast<double>(got_f32_[i]));
      // A NaN on one side only is the largest difference there is.
      max_abs_diff = std::max(max_abs_diff, std::isnan(d) ? HUGE_VAL : d);
    }
  }
  metrics_.record_determinism_check(options_.mode, mismatch, max_abs_diff);
  {
    std::lock_guard<std::mutex> lock(mu_);
    ++stats_.checked;
    if (mismatch) ++stats_.mismatches;
  }
  if (!mismatch) return;
  const auto level = options_.mode == SplitMode::kDeterministic ? spdlog::level::err : spdlog::level::debug;
  spdlog::log(level,
              "determinism mismatch ({} mode): sequence_id={} layer={} length={} chunk_tokens={} splits={} "
              "recomputed alone: chunk_tokens={} splits={}; max_abs_diff={:g}",
              split_mode_name(options_.mode), m.id, m.layer, m.length, m.chunk_tokens, m.splits,
              outputs.chunk_tokens, splits, max_abs_diff);
}

}  // namespace pagoda
