#pragma once
// The CPU backend's classes, shared by its translation units: the backend owns
// the pools and the thread arena; each stream owns the scratch of its launches.

#include <oneapi/tbb/task_arena.h>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "pagoda/backend.h"

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
  CpuBackend(const CacheGeometry& g, int32_t threads, HostBuffer k, HostBuffer v);

  std::string name() const override { return "cpu"; }
  std::string device_name() const override { return device_name_; }
  const CacheGeometry& geometry() const override { return geometry_; }
  int32_t num_workers() const override { return threads_; }
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

 private:
  std::byte* at(std::byte* pool, int32_t layer, int32_t block, int32_t head, int32_t slot) const {
    return pool + geometry_.element_offset(layer, block, head, slot) * dtype_size(geometry_.dtype);
  }

  CacheGeometry geometry_;
  int32_t threads_;
  tbb::task_arena arena_;
  HostBuffer k_;
  HostBuffer v_;
  std::string device_name_;
};

// One work item of a launch: a chunk of one sequence for one KV head.
struct WorkItem {
  int32_t seq;
  int32_t kv_head;
  int32_t chunk;
};

class CpuStream final : public BackendStream {
 public:
  explicit CpuStream(CpuBackend& backend) : backend_(backend) {}

  Status write_kv(std::span<const KvWrite> writes) override;
  Status copy_block(int32_t src, int32_t dst) override;
  Status poison_blocks(std::span<const int32_t> blocks) override;
  Status decode(const DecodeLaunch& launch, DecodeOutputs& outputs) override;
  StatusOr<double> measure_memory_bandwidth(int64_t bytes) override;

 private:
  CpuBackend& backend_;
  // A launch's scratch, reused: no allocation per call once warm.
  std::vector<WorkItem> items_;
  std::vector<int32_t> first_item_;  // [batch + 1] items of sequence b, KV-head-major
  std::vector<float> q32_;           // [batch, num_q_heads, head_dim] scaled by scale * log2(e)
  std::vector<float> stats_;         // [items, group, 2] (m, l)
  std::vector<float> accs_;          // [items, group, head_dim]
};

}  // namespace pagoda::cpu
