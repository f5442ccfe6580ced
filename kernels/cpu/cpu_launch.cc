// One CPU decode launch, executing the plan of pagoda/decode_plan.h: each plan
// item (a chunk and the sequences reading it) becomes tasks of at most
// kMaxTaskRows rows per KV head, their partial states run on the arena's
// threads, then each (row, query head) merges its chunks in order.
#include <oneapi/tbb/blocked_range.h>
#include <oneapi/tbb/parallel_for.h>

#include <algorithm>
#include <atomic>
#include <cassert>
#include <chrono>
#include <cmath>
#include <optional>
#include <utility>

#include "pagoda/host_convert.h"
#include "cpu/cpu_backend_impl.h"
#include "cpu/decode_cpu.h"
#include "cpu/state_merge.h"
#include "pagoda/cpu_phase_clock.h"
#include "pagoda/cpu_sequence_tasks.h"
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
// ... unless their multiply-adds (rows x keys x q heads x (head_dim +
// v_head_dim)) reach twice those of GQA 4 at head_dim 128 with one query row
// at that bound: wide groups and draft rows put far more work on each key.
// Latent attention's 32 heads reach it at 241 keys. On AMD Zen 3 (AVX2, 2
// threads, bf16, medians of 6 alternating runs) two sequences of 1024 keys
// ran on the calling thread in 2.08 ms; on the pool, 1.40 ms.
constexpr int64_t kParallelMinMultiplyAdds = 2 * kParallelMinTokenHeads * 4 * (128 + 128);

// Whether a launch runs on the pool, by its (key, KV head) pairs and
// multiply-adds.
bool worth_the_pool(const DecodeLaunch& launch, const CacheGeometry& g) {
  int64_t keys = 0;
  int64_t row_keys = 0;
  for (int32_t b = 0; b < launch.tables.batch; ++b) {
    const int64_t length = launch.tables.lengths[b];
    keys += length;
    const int64_t seen = launch.sliding_window > 0 ? std::min<int64_t>(length, launch.sliding_window) : length;
    row_keys += seen * launch.rows_of(b);
  }
  return keys * g.num_kv_heads >= kParallelMinTokenHeads ||
         row_keys * g.num_q_heads * (g.head_dim + g.v_dim()) >= kParallelMinMultiplyAdds;
}

// A launch on the pool with fewer than kSplitTasksPerThread tasks a thread
// splits its groups' heads into halves (each half reading the keys again)
// while the halves keep at least kMinSplitHeads heads: latent attention's one
// KV head at one sequence of one chunk is otherwise one task, on one thread.
// A row's bits do not depend on the rows beside it in a task. AMD Zen 3,
// AVX2, 2 threads, bf16, one sequence of 256 keys (medians of 8-10
// alternating runs of 400-800 launches): 0.54x the time of one task for 32
// and for 128 heads; two tasks a thread rather than one, 0.94x the time at 32
// heads (four tasks of 8 against two of 16) and 1.02x at 128.
constexpr int32_t kSplitTasksPerThread = 2;
constexpr int32_t kMinSplitHeads = 8;
// Split heads go in multiples of the kernels' row blocks of four.
constexpr int32_t kSplitHeadsMultiple = 4;

// force_sequence_tasks: -1 the launch's choice, 0 never, 1 wherever eligible.
std::atomic<int> g_sequence_tasks{-1};

// A task's heads and most positions: all query heads of the group (at most
// kMaxTaskRows; split when the group alone is larger) for as many positions
// as fit in kTaskRowsTarget rows.
struct TaskShape {
  int32_t heads;
  int32_t positions;
};
// With `splits`, the group's heads go to that many tasks, whole row blocks each.
TaskShape task_shape(const CacheGeometry& g, int32_t splits = 1) {
  int32_t heads = std::min(g.group_size(), kMaxTaskRows);
  if (splits > 1) heads = round_up((heads + splits - 1) / splits, kSplitHeadsMultiple);
  return {heads, std::max(1, kTaskRowsTarget / heads)};
}

// Sequence tasks only for tasks of this many rows or more: compute-bound
// ones, which gain the set-up a task per chunk repeats. AMD Zen 5, 8 x 4096
// tokens, 2 threads, deterministic mode, medians of 3 to 8 alternating runs of
// one binary, sequence tasks against a task per chunk: fp16 GQA 4 with four
// query rows (16 rows) 0.95-0.975x the time on AVX-512 and 0.976-0.986x on
// AVX2, GQA 8 with four 0.95x, bf16 and e4m3 GQA 4 with four on the dot
// products 0.97x and 0.96x, latent attention's 32 heads 0.93x. Where the
// reads bound the task, a task per chunk measured faster: GQA 8 with one
// query row 1.03x, head_dim 64 1.065x, bf16 GQA 4 with one 1.05x, e4m3 1.03x,
// GQA 1 with one and four 1.05x and 1.02x. Those narrow rows gain little
// (one pinned thread from memory: GQA 8 with one query row 0.99x, head_dim 64
// 0.98x; 32 x 2048 tokens on 2 threads 1.005x and 0.97x), and at 8 x 4096
// tokens 64 tasks leave one of two threads up to a task's time idle at the
// end, where 512 left it an eighth of that.
constexpr int32_t kSequenceTaskMinRows = 16;

// Runs fn(begin, end) over [0, n): in pieces of at least `grain` on the pool
// when called inside the arena with `parallel`, else on the calling thread.
template <typename Fn>
void run_range(bool parallel, size_t n, size_t grain, const Fn& fn) {
  if (!parallel) return fn(0, n);
  tbb::parallel_for(tbb::blocked_range<size_t>(0, n, grain),
                    [&](const tbb::blocked_range<size_t>& r) { fn(r.begin(), r.end()); });
}

}  // namespace

void force_sequence_tasks(std::optional<bool> on) { g_sequence_tasks = on ? static_cast<int>(*on) : -1; }

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
  fp16_tile_ = fp16_tile_serves();
  time_phases_ = kernel_phases_timed();
  prefetch_ = prefetch_levels();
  prefetch_ahead_ = prefetch_distance();
  score_scale_ = unit_ != MatrixUnit::kNone ? qscale : 1.f;
  if (unit_ == MatrixUnit::kNone) {
    for (float& x : q32_) x *= qscale;
  }
}

// Which sequences run as sequence tasks (pagoda/cpu_sequence_tasks.h). A
// row's bits are the same either way only where a chunk is one sub-block:
// the chunk's state is then its one sub-block's, and a sequence task merges
// the sub-blocks in the order the chunks' states would be merged (a chunk of
// several sub-blocks would merge them as a chunk first, and merges do not
// associate bit for bit). Eligible: such chunks, at least two of them, none
// shared. Chosen: each eligible sequence whose tasks hold at least
// kSequenceTaskMinRows rows and whose reads (key rows of one KV head: a
// task's) are at most a balanced share of the launch's, the reads of all its
// KV heads over kWavesPerWorker tasks per thread (fast mode's aim,
// pagoda/split_plan.h), so that the threads still end together (on the
// calling thread alone, any).
void CpuStream::plan_sequence_tasks(bool parallel) {
  const CacheGeometry& g = backend_.geometry();
  const std::span<const PlanSequence> seqs = plan_.sequences();
  sequence_task_.assign(seqs.size(), 0);
  const int forced = g_sequence_tasks.load(std::memory_order_relaxed);
  if (forced == 0 || plan_.chunk_tokens() != kSubBlockTokens) return;
  // Candidates by their chunks and rows first: most launches (one query row
  // of a narrow group) have none, and skip the reads below.
  const TaskShape shape = task_shape(g);
  bool any = false;
  for (size_t b = 0; b < seqs.size(); ++b) {
    const int32_t rows = shape.heads * std::min(seqs[b].rows, shape.positions);
    sequence_task_[b] = seqs[b].chunks.count() >= 2 && (forced == 1 || rows >= kSequenceTaskMinRows);
    any = any || sequence_task_[b];
  }
  if (!any) return;
  // Reads per sequence; -1 marks one with a shared chunk.
  sequence_reads_.assign(seqs.size(), 0);
  int64_t reads = 0;
  for (const PlanItem& item : plan_.items()) {
    const int64_t n = span_tokens(plan_.item_keys(item));
    reads += n;
    for (int32_t m = item.first_member; m < item.end_member; ++m) {
      int64_t& r = sequence_reads_[static_cast<size_t>(plan_.members()[static_cast<size_t>(m)])];
      r = item.member_count() > 1 || r < 0 ? -1 : r + n;
    }
  }
  const int64_t tasks = (parallel ? backend_.threads() : 1) * static_cast<int64_t>(kWavesPerWorker);
  const int64_t share = (reads * g.num_kv_heads + tasks - 1) / tasks;
  for (size_t b = 0; b < seqs.size(); ++b) {
    const int64_t r = sequence_reads_[b];
    sequence_task_[b] = sequence_task_[b] && r >= 0 && (forced == 1 || !parallel || r <= share);
  }
}

// Every item's rows per KV head, in tasks of all query heads of the group (at
// most kMaxTaskRows; split when the group alone is larger) for as many
// positions as fit in kTaskRowsTarget rows, positions taken member by member.
// A sequence task's items are its sequence's, in order from its first chunk:
// the plan lists an unshared sequence's items one after another.
void CpuStream::make_tasks(int32_t head_splits) {
  const CacheGeometry& g = backend_.geometry();
  const int32_t group = g.group_size();
  const TaskShape shape = task_shape(g, head_splits);
  const int32_t heads_per_task = shape.heads;
  const int32_t positions_per_task = shape.positions;
  const std::span<const PlanItem> items = plan_.items();
  const std::span<const PlanSequence> seqs = plan_.sequences();
  const std::span<const KeySpan> keys = plan_.row_keys();
  tasks_.clear();
  positions_.clear();
  for (size_t it = 0; it < items.size();) {
    const PlanItem& item = items[it];
    size_t end_item = it + 1;
    if (item.member_count() == 1) {
      const auto leader = static_cast<size_t>(plan_.members()[static_cast<size_t>(item.first_member)]);
      if (sequence_task_[leader]) {
        assert(item.chunk == seqs[leader].chunks.first);
        end_item = it + static_cast<size_t>(seqs[leader].chunks.count());
      }
    }
    for (int32_t kv_head = 0; kv_head < g.num_kv_heads; ++kv_head) {
      for (int32_t g0 = 0; g0 < group; g0 += heads_per_task) {
        const int32_t q_head = kv_head * group + g0;
        int32_t in_task = positions_per_task;
        for (int32_t m = item.first_member; m < item.end_member; ++m) {
          const int32_t seq = plan_.members()[static_cast<size_t>(m)];
          const PlanSequence& s = seqs[static_cast<size_t>(seq)];
          for (int32_t i = 0; i < s.rows; ++i) {
            if (in_task == positions_per_task) {
              tasks_.push_back({static_cast<int32_t>(it), static_cast<int32_t>(end_item), kv_head, q_head,
                                static_cast<int32_t>(positions_.size()), 0, std::min(group - g0, heads_per_task)});
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
    it = end_item;
  }
}

void CpuStream::run_task(const CpuTask& task, const DecodeLaunch& launch, float* scratch) {
  const CacheGeometry& g = backend_.geometry();
  const PlanItem& item = plan_.items()[static_cast<size_t>(task.item)];
  const int32_t leader = plan_.members()[static_cast<size_t>(item.first_member)];
  const int64_t length = launch.tables.lengths[leader];
  const int32_t last_chunk = plan_.items()[static_cast<size_t>(task.end_item - 1)].chunk;
  const ChunkRange range{chunk_range(length, plan_.chunk_tokens(), item.chunk).begin,
                         chunk_range(length, plan_.chunk_tokens(), last_chunk).end};
  PartialTask t;
  t.geometry = &g;
  t.k_layer = backend_.k_at(launch.layer, 0, 0, 0);
  t.v_layer = g.latent() ? t.k_layer : backend_.v_at(launch.layer, 0, 0, 0);
  t.blocks = launch.tables.block_ids + launch.tables.block_indptr[leader];
  t.nan_free = backend_.nan_free_slots().layer(launch.layer);
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
  t.fp16_tile = fp16_tile_;
  t.time_phases = time_phases_;
  t.prefetch = prefetch_;
  t.prefetch_ahead = prefetch_ahead_;
  t.score_scale = score_scale_;
  // A sequence task starts from the sinks, where the merge of the chunks would.
  if (sequence_task_[static_cast<size_t>(leader)] && plan_.constants().has_sinks) {
    t.sinks = plan_.sinks_log2().data() + task.q_head;
  }
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
  // A sequence task left its one state in the first chunk's partials, its
  // sink merged in first.
  const bool sequence_task = sequence_task_[static_cast<size_t>(b)] != 0;
  const int32_t end_chunk = sequence_task ? s.chunks.first + 1 : s.chunks.end;
  if (plan_.constants().has_sinks && !sequence_task) {
    st = {plan_.sinks_log2()[static_cast<size_t>(qh)], 1.f};
    std::fill(acc, acc + d, 0.f);
    sum = acc;
  }
  const int64_t partial_rows = plan_.partial_rows();
  for (int32_t c = s.chunks.first; c < end_chunk; ++c) {
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
    merge_state(st, acc, part, part_acc, static_cast<int>(d));
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

  const bool parallel = threads > 1 && worth_the_pool(launch, g);
  load_q(launch);
  plan_sequence_tasks(parallel);
  make_tasks(1);
  const int32_t task_heads = task_shape(g).heads;
  for (int32_t splits = 2; parallel && std::cmp_less(tasks_.size(), kSplitTasksPerThread * threads) &&
                           task_heads >= splits * kMinSplitHeads;
       splits *= 2) {
    make_tasks(splits);
  }
  stats_.resize(static_cast<size_t>(plan_.partial_rows()) * 2);
  accs_.resize(static_cast<size_t>(plan_.partial_rows() * g.v_dim()));
  const int64_t scratch_floats =
      partial_scratch_floats(std::min(kMaxTaskRows, std::max(g.group_size(), kTaskRowsTarget)), g.head_dim);

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
