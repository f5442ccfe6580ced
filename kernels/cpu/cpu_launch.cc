// One CPU decode launch: the batch's work items (sequence, KV head, chunk), their
// partial states on the arena's threads, then the merge of each (sequence, query
// head) in chunk order.
#include <oneapi/tbb/blocked_range.h>
#include <oneapi/tbb/parallel_for.h>

#include <algorithm>
#include <cassert>
#include <chrono>
#include <cmath>

#include "cpu/convert_simd.h"
#include "cpu/cpu_backend_impl.h"
#include "cpu/decode_cpu.h"
#include "pagoda/softmax_state.h"

namespace pagoda::cpu {
namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

// Launches with fewer (token, KV head) pairs than this run on the calling
// thread (about 50 microseconds of work): waking the pool costs more.
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

Status CpuStream::decode(const DecodeLaunch& launch, DecodeOutputs& out) {
  const CacheGeometry& g = backend_.geometry();
  assert(launch.layer >= 0 && launch.layer < g.num_layers);
  assert(launch.scale > 0.f && std::isfinite(launch.scale));
  const auto t0 = Clock::now();
  const BatchBlockTables& tables = launch.tables;
  const int32_t batch = tables.batch;
  const int32_t group = g.group_size();
  const int64_t d = g.head_dim;

  int64_t total_tokens = 0;
  int32_t max_length = 0;
  for (int32_t b = 0; b < batch; ++b) {
    total_tokens += tables.lengths[b];
    max_length = std::max(max_length, tables.lengths[b]);
  }
  const int32_t threads = backend_.threads();
  const int32_t chunk_tokens = choose_chunk_tokens({launch.mode, launch.split_tokens, g.block_size, total_tokens,
                                                    max_length, g.num_kv_heads, threads});

  items_.clear();
  first_item_.assign(batch + 1, 0);
  for (int32_t b = 0; b < batch; ++b) {
    const int32_t chunks = num_chunks(tables.lengths[b], chunk_tokens);
    if (out.splits) out.splits[b] = chunks;
    for (int32_t h = 0; h < g.num_kv_heads; ++h)
      for (int32_t c = 0; c < chunks; ++c) items_.push_back({b, h, c});
    first_item_[b + 1] = static_cast<int32_t>(items_.size());
  }
  out.chunk_tokens = chunk_tokens;

  // q goes to fp32 once, scaled by scale * log2(e) so scores are in base 2.
  const int64_t q_elems = static_cast<int64_t>(batch) * g.num_q_heads * d;
  q32_.resize(q_elems);
  to_float(launch.q, launch.q_dtype, q32_.data(), q_elems);
  const float qscale = scale_log2(launch.scale);
  for (float& x : q32_) x *= qscale;

  stats_.resize(items_.size() * group * 2);
  accs_.resize(items_.size() * group * d);
  const std::byte* k_layer = backend_.k_at(launch.layer, 0, 0, 0);
  const std::byte* v_layer = backend_.v_at(launch.layer, 0, 0, 0);

  const bool parallel = threads > 1 && total_tokens * g.num_kv_heads >= kParallelMinTokenHeads;
  auto partials = [&](size_t begin, size_t end) {
    for (size_t i = begin; i != end; ++i) {
      const WorkItem& it = items_[i];
      const ChunkRange range = chunk_range(tables.lengths[it.seq], chunk_tokens, it.chunk);
      PartialTask task;
      task.geometry = &g;
      task.k_layer = k_layer;
      task.v_layer = v_layer;
      task.blocks = tables.block_ids + tables.block_indptr[it.seq];
      task.begin = range.begin;
      task.end = range.end;
      task.kv_head = it.kv_head;
      task.q = q32_.data() + (static_cast<int64_t>(it.seq) * g.num_q_heads + it.kv_head * group) * d;
      task.m = stats_.data() + i * group * 2;
      task.l = task.m + group;
      task.acc = accs_.data() + i * group * d;
      compute_partial(task);
    }
  };
  Clock::time_point t_merge;

  // Merge in chunk order, one (sequence, query head) at a time.
  const int64_t out_row_bytes = d * static_cast<int64_t>(dtype_size(launch.q_dtype));
  auto merges = [&](size_t begin, size_t end) {
    alignas(64) float acc[256];  // head_dim <= 256 (geometry_rules.h)
    for (size_t row = begin; row != end; ++row) {
      const auto b = static_cast<int32_t>(row / g.num_q_heads);
      const auto qh = static_cast<int32_t>(row % g.num_q_heads);
      const int32_t kvh = qh / group;
      const int32_t hg = qh % group;
      const int32_t chunks = (first_item_[b + 1] - first_item_[b]) / g.num_kv_heads;
      SoftmaxStats<float> s;
      std::fill(acc, acc + d, 0.f);
      for (int32_t c = 0; c < chunks; ++c) {
        const size_t i = static_cast<size_t>(first_item_[b]) + static_cast<size_t>(kvh) * chunks + c;
        const SoftmaxStats<float> p{stats_[i * group * 2 + hg], stats_[i * group * 2 + group + hg]};
        merge_into(s, acc, p, accs_.data() + (i * group + hg) * d, static_cast<int>(d));
      }
      const float inv = inverse_sum(s.l);
      for (int64_t i = 0; i < d; ++i) acc[i] *= inv;
      from_float(acc, static_cast<std::byte*>(out.out) + row * out_row_bytes, launch.q_dtype, d);
      if (out.lse) out.lse[row] = natural_lse(s.m, s.l);
    }
  };
  // Both phases inside one arena entry: the workers stay between them.
  auto both = [&] {
    run_range(parallel, items_.size(), 1, partials);
    t_merge = Clock::now();
    run_range(parallel, static_cast<size_t>(batch) * g.num_q_heads, 8, merges);
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
