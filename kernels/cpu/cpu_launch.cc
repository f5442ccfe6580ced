// One CPU decode launch: the batch's work items (sequence, KV head, chunk, row
// group), their partial states on the arena's threads, then the merge of each
// (row, query head) over its chunks in order.
#include <oneapi/tbb/blocked_range.h>
#include <oneapi/tbb/parallel_for.h>

#include <algorithm>
#include <cassert>
#include <chrono>
#include <cmath>

#include "cpu/convert_simd.h"
#include "cpu/cpu_backend_impl.h"
#include "cpu/decode_cpu.h"
#include "pagoda/key_ranges.h"
#include "pagoda/softmax_state.h"

namespace pagoda::cpu {
namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

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

Status CpuStream::decode(const DecodeLaunch& launch, DecodeOutputs& out) {
  const CacheGeometry& g = backend_.geometry();
  assert(launch.layer >= 0 && launch.layer < g.num_layers);
  assert(launch.scale > 0.f && std::isfinite(launch.scale));
  const auto t0 = Clock::now();
  const BatchBlockTables& tables = launch.tables;
  const int32_t batch = tables.batch;
  const int32_t group = g.group_size();
  const int64_t d = g.head_dim;
  const int32_t heads = g.num_q_heads;

  int64_t total_tokens = 0;
  int32_t max_length = 0;
  for (int32_t b = 0; b < batch; ++b) {
    total_tokens += tables.lengths[b];
    max_length = std::max(max_length, tables.lengths[b]);
  }
  const int32_t threads = backend_.threads();
  const int32_t chunk_tokens = choose_chunk_tokens({launch.mode, launch.split_tokens, g.block_size, total_tokens,
                                                    max_length, g.num_kv_heads, threads});
  out.chunk_tokens = chunk_tokens;

  // Row groups: every query head of a KV head for as many positions as fit a task.
  const int32_t heads_per_task = std::min(group, kMaxTaskRows);
  const int32_t positions_per_task = std::max(1, kMaxTaskRows / heads_per_task);

  // Work items and where each sequence's partials live: per chunk, a block of
  // [rows of the sequence, num_q_heads] partial states.
  items_.clear();
  seqs_.resize(static_cast<size_t>(batch));
  int64_t partial_rows = 0;
  for (int32_t b = 0; b < batch; ++b) {
    const int32_t n = launch.rows_of(b);
    assert(n <= tables.lengths[b] || (n == 1 && tables.lengths[b] == 0));
    const ChunkSpan chunks = chunks_needed(tables.lengths[b], n, launch.sliding_window, chunk_tokens);
    seqs_[static_cast<size_t>(b)] = {chunks, partial_rows};
    if (out.splits) out.splits[b] = chunks.count();
    for (int32_t c = chunks.first; c < chunks.end; ++c)
      for (int32_t h = 0; h < g.num_kv_heads; ++h)
        for (int32_t p0 = 0; p0 < n; p0 += positions_per_task)
          for (int32_t g0 = 0; g0 < group; g0 += heads_per_task)
            items_.push_back({b, h, c, p0, std::min(n, p0 + positions_per_task), g0,
                              std::min(group, g0 + heads_per_task)});
    partial_rows += static_cast<int64_t>(chunks.count()) * n * heads;
  }
  ranges_.resize(static_cast<size_t>(launch.total_rows()));
  for (int32_t b = 0; b < batch; ++b) {
    const int32_t n = launch.rows_of(b);
    for (int32_t i = 0; i < n; ++i) {
      const KeySpan k = row_keys(tables.lengths[b], n, i, launch.sliding_window);
      ranges_[static_cast<size_t>(launch.first_row(b) + i)] = {static_cast<int32_t>(k.begin),
                                                               static_cast<int32_t>(k.end)};
    }
  }

  // q goes to fp32 once, scaled by scale * log2(e) (scores in base 2), or by
  // scale alone when a soft-cap applies its tanh first (the kernel multiplies
  // by log2(e) after it).
  const int64_t q_elems = static_cast<int64_t>(launch.total_rows()) * heads * d;
  q32_.resize(static_cast<size_t>(q_elems));
  to_float(launch.q, launch.q_dtype, q32_.data(), q_elems);
  // The layer's K scale (and an fp8 read factor) is folded in here once, the V
  // scale into the merge's 1 / l: read = stored * scale costs nothing per element.
  const KvScale kv = backend_.kv_scale(launch.layer);
  const float k_factor = kv.k * fp8_read_factor(g.dtype);
  const float v_factor = kv.v * fp8_read_factor(g.dtype);
  const float qscale = (launch.soft_cap > 0.f ? launch.scale : scale_log2(launch.scale)) * k_factor;
  for (float& x : q32_) x *= qscale;

  stats_.resize(static_cast<size_t>(partial_rows) * 2);
  accs_.resize(static_cast<size_t>(partial_rows * d));
  const std::byte* k_layer = backend_.k_at(launch.layer, 0, 0, 0);
  const std::byte* v_layer = backend_.v_at(launch.layer, 0, 0, 0);
  const int64_t scratch_floats = partial_scratch_floats(kMaxTaskRows, g.head_dim);

  const bool parallel = threads > 1 && total_tokens * g.num_kv_heads >= kParallelMinTokenHeads;
  auto partials = [&](size_t begin, size_t end) {
    float* scratch = thread_scratch(scratch_floats);
    for (size_t i = begin; i != end; ++i) {
      const WorkItem& it = items_[i];
      const SequencePartials& sp = seqs_[static_cast<size_t>(it.seq)];
      const int32_t n = launch.rows_of(it.seq);
      const int32_t first_row = launch.first_row(it.seq);
      const ChunkRange range = chunk_range(tables.lengths[it.seq], chunk_tokens, it.chunk);
      PartialTask task;
      task.geometry = &g;
      task.k_layer = k_layer;
      task.v_layer = v_layer;
      task.blocks = tables.block_ids + tables.block_indptr[it.seq];
      task.kv_head = it.kv_head;
      task.chunk_begin = range.begin;
      task.chunk_end = range.end;
      task.positions = it.position_end - it.position_begin;
      task.heads = it.head_end - it.head_begin;
      task.ranges = ranges_.data() + first_row + it.position_begin;
      const int32_t q_head = it.kv_head * group + it.head_begin;
      task.q = q32_.data() + ((static_cast<int64_t>(first_row) + it.position_begin) * heads + q_head) * d;
      task.q_position_stride = static_cast<int64_t>(heads) * d;
      task.soft_cap = launch.soft_cap;
      const int64_t row0 = sp.first_partial + (static_cast<int64_t>(it.chunk - sp.chunks.first) * n +
                                               it.position_begin) * heads + q_head;
      task.out_position_stride = heads;
      task.m = stats_.data() + row0;
      task.l = stats_.data() + partial_rows + row0;
      task.acc = accs_.data() + row0 * d;
      task.scratch = scratch;
      compute_partial(task);
    }
  };
  Clock::time_point t_merge;

  // Merge each (row, query head) over its sequence's chunks in order, the sink
  // (when given) first: one more state, m = sink * log2(e), l = 1, acc = 0.
  const int64_t out_row_bytes = d * static_cast<int64_t>(dtype_size(launch.q_dtype));
  auto merges = [&](size_t begin, size_t end) {
    alignas(64) float acc[256];  // head_dim <= 256 (geometry_rules.h)
    for (size_t out_row = begin; out_row != end; ++out_row) {
      const auto row = static_cast<int32_t>(out_row / static_cast<size_t>(heads));
      const auto qh = static_cast<int32_t>(out_row % static_cast<size_t>(heads));
      const int32_t b = launch.q_indptr
                            ? static_cast<int32_t>(std::upper_bound(launch.q_indptr, launch.q_indptr + batch + 1, row) -
                                                   launch.q_indptr) - 1
                            : row;
      const int32_t i = row - launch.first_row(b);
      const int32_t n = launch.rows_of(b);
      const SequencePartials& sp = seqs_[static_cast<size_t>(b)];
      SoftmaxStats<float> s;
      std::fill(acc, acc + d, 0.f);
      if (launch.sinks != nullptr) s = {static_cast<float>(launch.sinks[qh] * kLog2e), 1.f};
      for (int32_t c = 0; c < sp.chunks.count(); ++c) {
        const int64_t p = sp.first_partial + (static_cast<int64_t>(c) * n + i) * heads + qh;
        const SoftmaxStats<float> part{stats_[static_cast<size_t>(p)], stats_[static_cast<size_t>(partial_rows + p)]};
        merge_into(s, acc, part, accs_.data() + p * d, static_cast<int>(d));
      }
      const float inv = inverse_sum(s.l) * v_factor;
      for (int64_t e = 0; e < d; ++e) acc[e] *= inv;
      from_float(acc, static_cast<std::byte*>(out.out) + static_cast<int64_t>(out_row) * out_row_bytes,
                 launch.q_dtype, d);
      if (out.lse) out.lse[out_row] = natural_lse(s.m, s.l);
    }
  };
  // Both phases inside one arena entry: the workers stay between them.
  auto both = [&] {
    run_range(parallel, items_.size(), 1, partials);
    t_merge = Clock::now();
    run_range(parallel, static_cast<size_t>(launch.total_rows()) * heads, 8, merges);
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
