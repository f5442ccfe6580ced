// One CPU decode launch, executing the plan of pagoda/decode_plan.h: each plan
// item (a chunk and the sequences reading it) becomes tasks of at most
// kMaxTaskRows rows per KV head, their partial states run on the arena's
// threads, then each (row, query head) merges its chunks in order.
#include <oneapi/tbb/blocked_range.h>
#include <oneapi/tbb/parallel_for.h>

#include <algorithm>
#include <cassert>
#include <chrono>
#include <cmath>

#include "pagoda/host_convert.h"
#include "cpu/cpu_backend_impl.h"
#include "cpu/decode_cpu.h"
#include "pagoda/cpu_phase_clock.h"
#include "pagoda/cpu_targets.h"
#include "pagoda/softmax_state.h"
#include "pagoda/vocabulary.h"

namespace pagoda::cpu {
namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

// A chunk two sequences share costs more as one task of their rows (its V
// tiles converted once for both) than as two direct reads: measured on a
// 2-vCPU Sapphire Rapids guest, 2 forks of a 512-token chunk ran at 0.91x
// (AVX3) and 0.94x (AVX2) of unshared twins, 8 forks at 1.10x and 2.11x.
constexpr int32_t kMinSharedMembers = 3;

// Launches with fewer (key, KV head) pairs than this run on the calling thread
// (about 50 microseconds of work): waking the pool costs more.
constexpr int64_t kParallelMinTokenHeads = 4096;

// Runs fn(begin, end) over [0, n): in pieces of at least `grain` on the pool
// when called inside the arena with `parallel`, else on the calling thread.
template <typename Fn>
void run_range(bool parallel, size_t n, size_t grain, const Fn& fn) {
  if (!parallel) return fn(0, n);
  tbb::parallel_for(tbb::blocked_range<size_t>(0, n, grain),
                    [&](const tbb::blocked_range<size_t>& r) { fn(r.begin(), r.end()); });
}

}  // namespace

float* CpuStream::thread_scratch(int64_t floats) {
  AlignedFloats& s = scratch_.local();
  if (s.size < floats) {
    s.data.reset(static_cast<float*>(std::aligned_alloc(64, static_cast<size_t>((floats + 15) / 16 * 64))));
    s.size = floats;
  }
  return s.data.get();
}

// q goes to fp32 once, times the plan's factor (and the fp8 read factor of
// decode_cpu.h: e4m3 is read as 2^-8 of its value). On a matrix unit the factor
// multiplies the scores instead, so q reaches the bf16 multiplies as it came.
void CpuStream::load_q(const DecodeLaunch& launch) {
  const CacheGeometry& g = backend_.geometry();
  const int64_t q_elems = static_cast<int64_t>(launch.total_rows()) * g.num_q_heads * g.head_dim;
  q32_.resize(static_cast<size_t>(q_elems));
  convert_to_float(launch.q, launch.q_dtype, q32_.data(), q_elems);
  const float qscale = plan_.constants().q_scale * fp8_read_factor(g.dtype);
  unit_ = matrix_unit_for(g);
  fp8_tables_ = fp8_tables_serve(g);
  fp16_quad_tile_ = fp16_quad_tile_serves();
  time_phases_ = kernel_phases_timed();
  prefetch_ = prefetch_levels();
  prefetch_ahead_ = prefetch_distance();
  score_scale_ = unit_ != MatrixUnit::kNone ? qscale : 1.f;
  if (unit_ == MatrixUnit::kNone) {
    for (float& x : q32_) x *= qscale;
  }
}

// Every item's rows per KV head, in tasks of all query heads of the group (at
// most kMaxTaskRows; split when the group alone is larger) for as many
// positions as fit in kTaskRowsTarget rows, positions taken member by member.
void CpuStream::make_tasks() {
  const CacheGeometry& g = backend_.geometry();
  const int32_t group = g.group_size();
  const int32_t heads_per_task = std::min(group, kMaxTaskRows);
  const int32_t positions_per_task = std::max(1, kTaskRowsTarget / heads_per_task);
  const std::span<const PlanItem> items = plan_.items();
  const std::span<const PlanSequence> seqs = plan_.sequences();
  const std::span<const KeySpan> keys = plan_.row_keys();
  tasks_.clear();
  positions_.clear();
  for (size_t it = 0; it < items.size(); ++it) {
    const PlanItem& item = items[it];
    for (int32_t kv_head = 0; kv_head < g.num_kv_heads; ++kv_head) {
      for (int32_t g0 = 0; g0 < group; g0 += heads_per_task) {
        const int32_t q_head = kv_head * group + g0;
        int32_t in_task = positions_per_task;
        for (int32_t m = item.first_member; m < item.end_member; ++m) {
          const int32_t seq = plan_.members()[static_cast<size_t>(m)];
          const PlanSequence& s = seqs[static_cast<size_t>(seq)];
          for (int32_t i = 0; i < s.rows; ++i) {
            if (in_task == positions_per_task) {
              tasks_.push_back({static_cast<int32_t>(it), kv_head, static_cast<int32_t>(positions_.size()), 0,
                                std::min(group - g0, heads_per_task)});
              in_task = 0;
            }
            const int32_t row = s.first_row + i;
            const int64_t q_offset = (static_cast<int64_t>(row) * g.num_q_heads + q_head) * g.head_dim;
            positions_.push_back({q32_.data() + q_offset, keys[static_cast<size_t>(row)],
                                  plan_.partial_index(seq, item.chunk, i, q_head)});
            ++tasks_.back().positions;
            ++in_task;
          }
        }
      }
    }
  }
}

void CpuStream::run_task(const CpuTask& task, const DecodeLaunch& launch, float* scratch) {
  const CacheGeometry& g = backend_.geometry();
  const PlanItem& item = plan_.items()[static_cast<size_t>(task.item)];
  const int32_t leader = plan_.members()[static_cast<size_t>(item.first_member)];
  const ChunkRange range = chunk_range(launch.tables.lengths[leader], plan_.chunk_tokens(), item.chunk);
  PartialTask t;
  t.geometry = &g;
  t.k_layer = backend_.k_at(launch.layer, 0, 0, 0);
  t.v_layer = g.latent() ? t.k_layer : backend_.v_at(launch.layer, 0, 0, 0);
  t.blocks = launch.tables.block_ids + launch.tables.block_indptr[leader];
  t.kv_head = task.kv_head;
  t.chunk_begin = range.begin;
  t.chunk_end = range.end;
  t.positions = task.positions;
  t.heads = task.heads;
  t.position = positions_.data() + task.first_position;
  t.batch_invariant = launch.mode == SplitMode::kDeterministic;
  t.soft_cap = plan_.constants().soft_cap;
  t.unit = unit_;
  t.fp8_tables = fp8_tables_;
  t.fp16_quad_tile = fp16_quad_tile_;
  t.time_phases = time_phases_;
  t.prefetch = prefetch_;
  t.prefetch_ahead = prefetch_ahead_;
  t.score_scale = score_scale_;
  t.m = stats_.data();
  t.l = stats_.data() + plan_.partial_rows();
  t.acc = accs_.data();
  t.scratch = scratch;
  compute_partial(t);
}

// One (row, query head): its chunks' states in chunk order, the sink (when
// given) first: one more state, m = sink * log2(e), l = 1, acc = 0. Output
// rows are v_head_dim wide.
void CpuStream::merge_row(int64_t out_row, const DecodeLaunch& launch, DecodeOutputs& out) const {
  const CacheGeometry& g = backend_.geometry();
  const int64_t d = g.v_dim();
  const int32_t heads = g.num_q_heads;
  static_assert(kMaxHeadDim % 16 == 0, "the accumulator is whole 64-byte lines");
  alignas(64) float acc[kMaxHeadDim];
  const auto row = static_cast<int32_t>(out_row / heads);
  const auto qh = static_cast<int32_t>(out_row % heads);
  const int32_t b = plan_.row_sequence()[static_cast<size_t>(row)];
  const PlanSequence& s = plan_.sequences()[static_cast<size_t>(b)];
  // The running sum: merge_into's, except that the first state with keys is
  // read where it lies instead of copied, until a second one merges into acc
  // (most rows have one chunk: the same bits, one pass over the row).
  SoftmaxStats<float> st;
  const float* sum = nullptr;
  if (plan_.constants().has_sinks) {
    st = {plan_.sinks_log2()[static_cast<size_t>(qh)], 1.f};
    std::fill(acc, acc + d, 0.f);
    sum = acc;
  }
  const int64_t partial_rows = plan_.partial_rows();
  for (int32_t c = s.chunks.first; c < s.chunks.end; ++c) {
    const int64_t p = plan_.partial_index(b, c, row - s.first_row, qh);
    const SoftmaxStats<float> part{stats_[static_cast<size_t>(p)], stats_[static_cast<size_t>(partial_rows + p)]};
    const float* part_acc = accs_.data() + p * d;
    if (part.m == neg_inf<float>()) continue;
    if (sum == nullptr) {
      st = part;
      sum = part_acc;
      continue;
    }
    if (sum != acc) {
      std::copy(sum, sum + d, acc);
      sum = acc;
    }
    merge_into(st, acc, part, part_acc, static_cast<int>(d));
  }
  if (sum == nullptr) {
    std::fill(acc, acc + d, 0.f);
    sum = acc;
  }
  const float inv = inverse_sum(st.l) * plan_.constants().out_scale * fp8_read_factor(g.dtype);
  for (int64_t e = 0; e < d; ++e) acc[e] = sum[e] * inv;
  const int64_t out_row_bytes = d * static_cast<int64_t>(dtype_size(launch.q_dtype));
  convert_from_float(acc, static_cast<std::byte*>(out.out) + out_row * out_row_bytes, launch.q_dtype, d);
  if (out.lse) out.lse[out_row] = natural_lse(st.m, st.l);
}

Status CpuStream::decode(const DecodeLaunch& launch, DecodeOutputs& out) {
  const CacheGeometry& g = backend_.geometry();
  assert(launch.layer >= 0 && launch.layer < g.num_layers);
  assert(launch.scale > 0.f && std::isfinite(launch.scale));
  const auto t0 = Clock::now();
  const int32_t threads = backend_.threads();
  plan_.build(launch, g, backend_.kv_scale(launch.layer), {threads, launch.share_chunks, kMinSharedMembers});
  out.chunk_tokens = plan_.chunk_tokens();
  if (out.splits) {
    for (int32_t b = 0; b < launch.tables.batch; ++b) out.splits[b] = plan_.sequences()[static_cast<size_t>(b)].chunks.count();
  }
  out.kv_bytes_read = plan_.read_tokens() * g.token_kv_bytes();
  out.kv_bytes_shared = plan_.shared_tokens() * g.token_kv_bytes();

  load_q(launch);
  make_tasks();
  stats_.resize(static_cast<size_t>(plan_.partial_rows()) * 2);
  accs_.resize(static_cast<size_t>(plan_.partial_rows() * g.v_dim()));
  const int64_t scratch_floats =
      partial_scratch_floats(std::min(kMaxTaskRows, std::max(g.group_size(), kTaskRowsTarget)), g.head_dim);

  int64_t attended = 0;
  for (int32_t b = 0; b < launch.tables.batch; ++b) attended += launch.tables.lengths[b];
  const bool parallel = threads > 1 && attended * g.num_kv_heads >= kParallelMinTokenHeads;
  auto partials = [&](size_t begin, size_t end) {
    float* scratch = thread_scratch(scratch_floats);
    for (size_t i = begin; i != end; ++i) run_task(tasks_[i], launch, scratch);
  };
  auto merges = [&](size_t begin, size_t end) {
    for (size_t r = begin; r != end; ++r) merge_row(static_cast<int64_t>(r), launch, out);
  };
  Clock::time_point t_merge;
  // Both phases inside one arena entry: the workers stay between them.
  auto both = [&] {
    run_range(parallel, tasks_.size(), 1, partials);
    t_merge = Clock::now();
    run_range(parallel, static_cast<size_t>(launch.total_rows()) * g.num_q_heads, 8, merges);
  };
  if (parallel) {
    backend_.arena().execute(both);
  } else {
    both();
  }
  out.merge_seconds = seconds_since(t_merge);
  out.attention_seconds = seconds_since(t0);
  out.transfer_seconds = 0;
  return Status::Ok();
}

}  // namespace pagoda::cpu
