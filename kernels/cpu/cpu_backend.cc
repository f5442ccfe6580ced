#include "cpu/cpu_backend.h"

#include <sys/mman.h>

#include <oneapi/tbb/blocked_range.h>
#include <oneapi/tbb/parallel_for.h>
#include <oneapi/tbb/task_arena.h>

#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <limits>
#include <string>
#include <thread>
#include <vector>

#include "cpu/decode_cpu.h"
#include "pagoda/host_convert.h"
#include "pagoda/softmax_state.h"

namespace pagoda {
namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

struct FreeDeleter {
  void operator()(void* p) const { std::free(p); }
};
using HostBuffer = std::unique_ptr<std::byte, FreeDeleter>;

// Pools are 2 MiB aligned and asked to be backed by transparent huge pages: a
// worker reads 4 KiB pieces one block stride apart, one TLB entry each with
// small pages. Small buffers are cache-line aligned.
HostBuffer aligned_buffer(size_t bytes) {
  constexpr size_t kHuge = size_t{2} << 20;
  const size_t align = bytes >= kHuge ? kHuge : 64;
  const size_t rounded = (bytes + align - 1) / align * align;
  auto* p = static_cast<std::byte*>(std::aligned_alloc(align, rounded ? rounded : align));
  if (p != nullptr && align == kHuge) madvise(p, rounded, MADV_HUGEPAGE);  // advice only: failure is harmless
  return HostBuffer(p);
}

std::string cpu_model_name() {
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("model name", 0) == 0) {
      const auto colon = line.find(':');
      if (colon != std::string::npos) return line.substr(line.find_first_not_of(' ', colon + 1));
    }
  }
  return "cpu";
}

// Launches with fewer (token, KV head) pairs than this run on the calling
// thread (about 50 microseconds of work).
constexpr int64_t kParallelMinTokenHeads = 4096;

// One unit of work: a chunk of one sequence for one KV head.
struct WorkItem {
  int32_t seq;
  int32_t kv_head;
  int32_t chunk;
};

class CpuBackend final : public Backend {
 public:
  CpuBackend(const CacheGeometry& g, int32_t threads, HostBuffer k, HostBuffer v)
      : geometry_(g), threads_(threads), arena_(threads), k_(std::move(k)), v_(std::move(v)),
        device_name_(cpu_model_name() + " (" + cpu::simd_target_name() + ", " +
                     std::to_string(threads) + " threads)") {}

  std::string name() const override { return "cpu"; }
  std::string device_name() const override { return device_name_; }
  const CacheGeometry& geometry() const override { return geometry_; }
  int32_t num_workers() const override { return threads_; }

  Status write_kv(const KvWrite& w) override;
  Status copy_block(int32_t src, int32_t dst) override;
  Status poison_blocks(const int32_t* blocks, int32_t count) override;
  Status decode(const DecodeLaunch& launch, DecodeOutputs& out) override;
  StatusOr<double> measure_memory_bandwidth(int64_t bytes) override;

 private:
  std::byte* element(std::byte* pool, int32_t layer, int32_t block, int32_t head, int32_t slot) const {
    return pool + geometry_.element_offset(layer, block, head, slot) * dtype_size(geometry_.dtype);
  }
  Status check_block(const char* field, int32_t block) const {
    if (block < 0 || block >= geometry_.num_blocks) {
      return InvalidArgument("{}: expected a block id in [0, {}), received {}", field, geometry_.num_blocks, block);
    }
    return Status::Ok();
  }

  // Runs fn(begin, end) over [0, n): in pieces of at least `grain` on the pool
  // when called inside the arena with `parallel`, else on the calling thread.
  template <typename Fn>
  static void run_range(bool parallel, size_t n, size_t grain, const Fn& fn) {
    if (!parallel) return fn(0, n);
    tbb::parallel_for(tbb::blocked_range<size_t>(0, n, grain),
                      [&](const tbb::blocked_range<size_t>& r) { fn(r.begin(), r.end()); });
  }

  CacheGeometry geometry_;
  int32_t threads_;
  tbb::task_arena arena_;
  HostBuffer k_;
  HostBuffer v_;
  std::string device_name_;
};

Status CpuBackend::write_kv(const KvWrite& w) {
  const CacheGeometry& g = geometry_;
  if (w.layer < 0 || w.layer >= g.num_layers) {
    return InvalidArgument("layer: expected [0, {}), received {}", g.num_layers, w.layer);
  }
  const int64_t max_slot = static_cast<int64_t>(g.num_blocks) * g.block_size;
  for (int32_t i = 0; i < w.num_tokens; ++i) {
    if (w.slots[i] < 0 || w.slots[i] >= max_slot) {
      return InvalidArgument("slots[{}]: expected [0, {}), received {}", i, max_slot, w.slots[i]);
    }
  }
  const int64_t row = g.head_dim;
  const size_t in_size = dtype_size(w.dtype);
  for (int32_t i = 0; i < w.num_tokens; ++i) {
    const auto block = static_cast<int32_t>(w.slots[i] / g.block_size);
    const auto slot = static_cast<int32_t>(w.slots[i] % g.block_size);
    for (int32_t h = 0; h < g.num_kv_heads; ++h) {
      const int64_t src = (static_cast<int64_t>(i) * g.num_kv_heads + h) * row;
      convert(static_cast<const std::byte*>(w.k) + src * in_size, w.dtype,
              element(k_.get(), w.layer, block, h, slot), g.dtype, row);
      convert(static_cast<const std::byte*>(w.v) + src * in_size, w.dtype,
              element(v_.get(), w.layer, block, h, slot), g.dtype, row);
    }
  }
  return Status::Ok();
}

Status CpuBackend::copy_block(int32_t src, int32_t dst) {
  PAGODA_RETURN_IF_ERROR(check_block("src", src));
  PAGODA_RETURN_IF_ERROR(check_block("dst", dst));
  const size_t bytes = geometry_.block_stride() * dtype_size(geometry_.dtype);
  for (int32_t layer = 0; layer < geometry_.num_layers; ++layer) {
    std::memcpy(element(k_.get(), layer, dst, 0, 0), element(k_.get(), layer, src, 0, 0), bytes);
    std::memcpy(element(v_.get(), layer, dst, 0, 0), element(v_.get(), layer, src, 0, 0), bytes);
  }
  return Status::Ok();
}

Status CpuBackend::poison_blocks(const int32_t* blocks, int32_t count) {
  // All-ones bytes are a NaN in fp32, fp16 and bf16 alike.
  const size_t bytes = geometry_.block_stride() * dtype_size(geometry_.dtype);
  for (int32_t i = 0; i < count; ++i) {
    PAGODA_RETURN_IF_ERROR(check_block("blocks", blocks[i]));
    for (int32_t layer = 0; layer < geometry_.num_layers; ++layer) {
      std::memset(element(k_.get(), layer, blocks[i], 0, 0), 0xff, bytes);
      std::memset(element(v_.get(), layer, blocks[i], 0, 0), 0xff, bytes);
    }
  }
  return Status::Ok();
}

Status CpuBackend::decode(const DecodeLaunch& launch, DecodeOutputs& out) {
  const CacheGeometry& g = geometry_;
  if (launch.layer < 0 || launch.layer >= g.num_layers) {
    return InvalidArgument("layer: expected [0, {}), received {}", g.num_layers, launch.layer);
  }
  if (!(launch.scale > 0.f) || !std::isfinite(launch.scale)) {
    return InvalidArgument("scale: expected a finite value > 0, received {}", launch.scale);
  }
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
  const int32_t chunk_tokens = choose_chunk_tokens({launch.mode, launch.split_tokens, g.block_size,
                                                    total_tokens, max_length, g.num_kv_heads, threads_});

  // Scratch reused across calls on the same thread: no allocation per call once warm.
  thread_local std::vector<WorkItem> items;
  thread_local std::vector<int32_t> first_item;  // [batch + 1] items of sequence b, KV-head-major
  thread_local std::vector<float> q32;           // [batch, num_q_heads, head_dim]
  thread_local std::vector<float> stats;         // [items, group, 2] (m, l)
  thread_local std::vector<float> accs;          // [items, group, head_dim]
  items.clear();
  first_item.assign(batch + 1, 0);
  for (int32_t b = 0; b < batch; ++b) {
    const int32_t chunks = num_chunks(tables.lengths[b], chunk_tokens);
    if (out.splits) out.splits[b] = chunks;
    for (int32_t h = 0; h < g.num_kv_heads; ++h)
      for (int32_t c = 0; c < chunks; ++c) items.push_back({b, h, c});
    first_item[b + 1] = static_cast<int32_t>(items.size());
  }
  out.chunk_tokens = chunk_tokens;

  // q goes to fp32 once, scaled by scale * log2(e) so scores are in base 2.
  const int64_t q_elems = static_cast<int64_t>(batch) * g.num_q_heads * d;
  q32.resize(q_elems);
  convert_to_float(launch.q, launch.q_dtype, q32.data(), q_elems);
  const float qscale = scale_log2(launch.scale);
  for (float& x : q32) x *= qscale;

  stats.resize(items.size() * group * 2);
  accs.resize(items.size() * group * d);
  const int64_t layer_offset = g.element_offset(launch.layer, 0, 0, 0) * dtype_size(g.dtype);
  const std::byte* k_layer = k_.get() + layer_offset;
  const std::byte* v_layer = v_.get() + layer_offset;

  // thread_local names inside the lambdas below would resolve to the worker
  // threads' own (empty) instances: the workers see these raw pointers only.
  const int32_t* first_item_p = first_item.data();
  auto* items_p = items.data();
  auto* stats_p = stats.data();
  auto* accs_p = accs.data();
  const float* q_p = q32.data();
  const size_t num_items = items.size();
  // Small launches run on the calling thread: waking the pool costs more than
  // their work. Which thread computes an item never changes its bits.
  const bool parallel = threads_ > 1 && total_tokens * g.num_kv_heads >= kParallelMinTokenHeads;
  auto partials = [&](size_t begin, size_t end) {
    for (size_t i = begin; i != end; ++i) {
      const WorkItem& it = items_p[i];
      const ChunkRange range = chunk_range(tables.lengths[it.seq], chunk_tokens, it.chunk);
      cpu::PartialTask task;
      task.geometry = &g;
      task.k_layer = k_layer;
      task.v_layer = v_layer;
      task.blocks = tables.block_ids + tables.block_indptr[it.seq];
      task.begin = range.begin;
      task.end = range.end;
      task.kv_head = it.kv_head;
      task.q = q_p + (static_cast<int64_t>(it.seq) * g.num_q_heads + it.kv_head * group) * d;
      task.m = stats_p + i * group * 2;
      task.l = task.m + group;
      task.acc = accs_p + i * group * d;
      cpu::compute_partial(task);
    }
  };
  Clock::time_point t_merge;

  // Merge in chunk order, one (sequence, query head) at a time.
  const int64_t out_row_bytes = d * static_cast<int64_t>(dtype_size(launch.q_dtype));
  auto merges = [&](size_t begin, size_t end) {
    alignas(64) float acc[256];  // head_dim <= 256 (validate_geometry)
    for (size_t row = begin; row != end; ++row) {
      const auto b = static_cast<int32_t>(row / g.num_q_heads);
      const auto qh = static_cast<int32_t>(row % g.num_q_heads);
      const int32_t kvh = qh / group;
      const int32_t hg = qh % group;
      const int32_t chunks = (first_item_p[b + 1] - first_item_p[b]) / g.num_kv_heads;
      SoftmaxStats<float> s;
      std::fill(acc, acc + d, 0.f);
      for (int32_t c = 0; c < chunks; ++c) {
        const size_t i = static_cast<size_t>(first_item_p[b]) + static_cast<size_t>(kvh) * chunks + c;
        const SoftmaxStats<float> p{stats_p[i * group * 2 + hg], stats_p[i * group * 2 + group + hg]};
        merge_into(s, acc, p, accs_p + (i * group + hg) * d, static_cast<int>(d));
      }
      const float inv = inverse_sum(s.l);
      for (int64_t i = 0; i < d; ++i) acc[i] *= inv;
      convert_from_float(acc, static_cast<std::byte*>(out.out) + row * out_row_bytes, launch.q_dtype, d);
      if (out.lse) out.lse[row] = natural_lse(s.m, s.l);
    }
  };
  // Both phases inside one arena entry: the workers stay between them.
  auto both = [&] {
    run_range(parallel, num_items, 1, partials);
    t_merge = Clock::now();
    run_range(parallel, static_cast<size_t>(batch) * g.num_q_heads, 8, merges);
  };
  if (parallel) {
    arena_.execute(both);
  } else {
    both();
  }
  out.merge_seconds = seconds_since(t_merge);
  out.attention_seconds = seconds_since(t0);
  out.transfer_seconds = 0;
  return Status::Ok();
}

StatusOr<double> CpuBackend::measure_memory_bandwidth(int64_t bytes) {
  if (bytes <= 0) return InvalidArgument("bytes: expected > 0, received {}", bytes);
  const int64_t n = bytes / static_cast<int64_t>(sizeof(uint64_t));
  HostBuffer buf = aligned_buffer(static_cast<size_t>(n) * sizeof(uint64_t));
  auto* p = reinterpret_cast<uint64_t*>(buf.get());
  for (int64_t i = 0; i < n; ++i) p[i] = static_cast<uint64_t>(i) * 0x9e3779b97f4a7c15ull;
  // A streaming read on the backend's threads, the same threads decode uses.
  // XOR is associative, so the compiler vectorises the loop and the read, not
  // the arithmetic, sets the pace. Best of three.
  double best = std::numeric_limits<double>::infinity();
  volatile uint64_t sink = 0;
  for (int rep = 0; rep < 3; ++rep) {
    const auto t0 = Clock::now();
    std::vector<uint64_t> partial(static_cast<size_t>(threads_), 0);
    arena_.execute([&] {
      tbb::parallel_for(int32_t{0}, threads_, [&](int32_t w) {
        const int64_t lo = n * w / threads_, hi = n * (w + 1) / threads_;
        uint64_t x = 0;
        for (int64_t i = lo; i < hi; ++i) x ^= p[i];
        partial[static_cast<size_t>(w)] = x;
      });
    });
    best = std::min(best, seconds_since(t0));
    for (uint64_t x : partial) sink = sink ^ x;
  }
  return static_cast<double>(n) * sizeof(uint64_t) / best;
}

}  // namespace

Status validate_geometry(const CacheGeometry& g) {
  if (g.num_layers < 1) return InvalidArgument("layers: expected >= 1, received {}", g.num_layers);
  if (g.num_kv_heads < 1) return InvalidArgument("kv_heads: expected >= 1, received {}", g.num_kv_heads);
  if (g.num_q_heads < 1 || g.num_q_heads % g.num_kv_heads != 0) {
    return InvalidArgument("q_heads: expected a positive multiple of kv_heads ({}), received {}",
                           g.num_kv_heads, g.num_q_heads);
  }
  if (!supported_head_dim(g.head_dim)) {
    return InvalidArgument("head_dim: expected 64, 128 or 256, received {}", g.head_dim);
  }
  if (g.block_size < 1) return InvalidArgument("block_size: expected >= 1, received {}", g.block_size);
  if (g.num_blocks < 1) return InvalidArgument("num_blocks: expected >= 1, received {}", g.num_blocks);
  return Status::Ok();
}

StatusOr<std::unique_ptr<Backend>> make_cpu_backend(const BackendOptions& options) {
  const CacheGeometry& g = options.geometry;
  PAGODA_RETURN_IF_ERROR(validate_geometry(g));
  if (options.cpu_threads < 0) {
    return InvalidArgument("threads: expected >= 0 (0 = all cores), received {}", options.cpu_threads);
  }
  const int32_t threads = options.cpu_threads > 0
                              ? options.cpu_threads
                              : static_cast<int32_t>(std::max(1u, std::thread::hardware_concurrency()));
  const size_t bytes = static_cast<size_t>(g.pool_elements()) * dtype_size(g.dtype);
  HostBuffer k = aligned_buffer(bytes);
  HostBuffer v = aligned_buffer(bytes);
  if (!k || !v) {
    return ResourceExhausted("cache: could not allocate 2 x {} bytes of host memory for {} blocks", bytes,
                             g.num_blocks);
  }
  return std::unique_ptr<Backend>(new CpuBackend(g, threads, std::move(k), std::move(v)));
}

}  // namespace pagoda
