#pragma once
// The CPU backend's classes, shared by its translation units: the backend owns
// the pools and the thread arena; each stream owns the scratch of its launches.

#include <oneapi/tbb/enumerable_thread_specific.h>
#include <oneapi/tbb/task_arena.h>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "cpu/decode_cpu.h"
#include "cpu/nan_free_slots.h"
#include "pagoda/backend.h"
#include "pagoda/decode_plan.h"

namespace pagoda::cpu {

struct FreeDeleter {
  void operator()(void* p) const { std::free(p); }
};
using HostBuffer = std::unique_ptr<std::byte, FreeDeleter>;

// `bytes` of host memory; 2 MiB aligned and advised onto transparent huge pages
// when that large (a worker reads 4 KiB pieces one block stride apart: one TLB
// entry each with small pages), cache-line aligned otherwise. Null on failure.
HostBuffer aligned_buffer(size_t bytes);

class CpuBackend final : public Backend {
 public:
  CpuBackend(const CacheGeometry& g, int32_t threads, std::vector<KvScale> scales, HostBuffer k, HostBuffer v);

  std::string name() const override { return "cpu"; }
  std::string device_name() const override { return device_name_; }
  const CacheGeometry& geometry() const override { return geometry_; }
  int32_t num_workers() const override { return threads_; }
  KvScale kv_scale(int32_t layer) const override { return scales_[static_cast<size_t>(layer)]; }
  StatusOr<std::unique_ptr<BackendStream>> open_stream() override;

  int32_t threads() const { return threads_; }
  tbb::task_arena& arena() { return arena_; }
  // Byte address of (layer, block, head, slot) in a pool.
  std::byte* k_at(int32_t layer, int32_t block, int32_t head, int32_t slot) const {
    return at(k_.get(), layer, block, head, slot);
  }
  std::byte* v_at(int32_t layer, int32_t block, int32_t head, int32_t slot) const {
    return at(v_.get(), layer, block, head, slot);
  }
  // Which slots of an e4m3 cache hold no NaN code; every write to the pools
  // reports to it.
  NanFreeSlots& nan_free_slots() { return nan_free_; }

 private:
  std::byte* at(std::byte* pool, int32_t layer, int32_t block, int32_t head, int32_t slot) const {
    return pool + geometry_.element_offset(layer, block, head, slot) * dtype_size(geometry_.dtype);
  }

  CacheGeometry geometry_;
  int32_t threads_;
  std::vector<KvScale> scales_;  // [num_layers]
  tbb::task_arena arena_;
  HostBuffer k_;
  HostBuffer v_;
  NanFreeSlots nan_free_;
  std::string device_name_;
};

// One task of a launch: the rows of plan items [item, end_item) for one KV
// head, at most kMaxTaskRows of them: positions [first_position,
// first_position + positions) of the launch's position list, query heads
// [q_head, q_head + heads). One item (a chunk and the sequences reading it),
// or a sequence task's (cpu_sequence_tasks.h): all of one sequence's chunks.
struct CpuTask {
  int32_t item;
  int32_t end_item;
  int32_t kv_head;
  int32_t q_head;
  int32_t first_position;
  int32_t positions;
  int32_t heads;
};

// A 64-byte aligned float buffer that only grows.
struct AlignedFloats {
  std::unique_ptr<float, FreeDeleter> data;
  int64_t size = 0;
};

class CpuStream final : public BackendStream {
 public:
  explicit CpuStream(CpuBackend& backend) : backend_(backend) {}

  Status write_kv(std::span<const KvWrite> writes) override;
  Status read_kv(int32_t layer, std::span<const int64_t> slots, void* k, void* v) override;
  Status write_kv_raw(int32_t layer, std::span<const int64_t> slots, const void* k, const void* v) override;
  Status copy_block(int32_t src, int32_t dst) override;
  Status poison_blocks(std::span<const int32_t> blocks) override;
  Status decode(const DecodeLaunch& launch, DecodeOutputs& outputs) override;
  StatusOr<double> measure_memory_bandwidth(int64_t bytes) override;

 private:
  // The calling thread's kernel scratch of at least `floats` floats.
  float* thread_scratch(int64_t floats);
  // The steps of a launch after its plan: q to fp32 and scaled, the tasks, then
  // (on the pool) every task's partial states and every row's merge.
  void load_q(const DecodeLaunch& launch);
  void plan_sequence_tasks(bool parallel);
  void make_tasks(int32_t head_splits);
  void run_task(const CpuTask& task, const DecodeLaunch& launch, float* scratch);
  void merge_row(int64_t out_row, const DecodeLaunch& launch, DecodeOutputs& out) const;

  CpuBackend& backend_;
  // A launch's scratch, reused: no allocation per call once warm.
  DecodePlan plan_;
  std::vector<CpuTask> tasks_;
  std::vector<TaskPosition> positions_;  // the tasks' positions, task by task
  // [sequences] 1 where the sequence runs as sequence tasks (its state in its
  // first chunk's partials, the sink folded in), else 0.
  std::vector<uint8_t> sequence_task_;
  std::vector<int64_t> sequence_reads_;  // [sequences] scratch: key rows of one KV head it reads
  std::vector<float> q32_;               // [rows, num_q_heads, head_dim] scaled (unscaled on the AMX path)
  MatrixUnit unit_ = MatrixUnit::kNone;  // this launch's bf16 matrix unit (matrix_unit_for)
  bool fp8_tables_ = false;              // this launch widens fp8 by tables (fp8_tables_serve)
  bool fp16_tile_ = false;               // and shared fp16 rows through a tile (fp16_tile_serves)
  bool time_phases_ = false;             // and whether tasks time their phases (kernel_phases_timed)
  PrefetchLevels prefetch_;              // this launch's prefetch levels (prefetch_levels)
  PrefetchDistance prefetch_ahead_;      // and distance (prefetch_distance)
  float score_scale_ = 1.f;              // the AMX path's factor on each score
  std::vector<float> stats_;             // [2][partial rows]: m, then l
  std::vector<float> accs_;              // [partial rows, head_dim]
  tbb::enumerable_thread_specific<AlignedFloats> scratch_;  // per worker thread: the kernel's
};

}  // namespace pagoda::cpu
