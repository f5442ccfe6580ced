#pragma once
// The CUDA backend: the K/V pools in device memory (one cudaMalloc each), shared
// by every stream. Each CudaStream owns a cudaStream_t, its events and its
// staging and workspace buffers, preallocated from max_batch and the pool's
// context so that a steady-state decode allocates nothing. Streams run
// concurrently; each call is synchronous on its own stream (it returns when its
// results are on the host and its writes are visible to every other stream).

#include <cuda_runtime_api.h>

#include <memory>
#include <string>
#include <vector>

#include "cuda/device_memory.h"
#include "cuda/kernel_params.h"
#include "pagoda/backend.h"
#include "pagoda/decode_plan.h"

namespace pagoda::cuda {

class CudaBackend final : public Backend {
 public:
  static StatusOr<std::unique_ptr<CudaBackend>> create(const BackendOptions& options);

  std::string name() const override { return "cuda"; }
  std::string device_name() const override { return device_name_; }
  const CacheGeometry& geometry() const override { return geometry_; }
  int32_t num_workers() const override { return num_workers_; }
  KvScale kv_scale(int32_t layer) const override { return scales_[static_cast<size_t>(layer)]; }
  StatusOr<std::unique_ptr<BackendStream>> open_stream() override;

  int device() const { return device_; }
  int32_t max_batch() const { return max_batch_; }
  const PartialKernel& partial_kernel() const { return *partial_; }
  void* k_pool() const { return k_pool_.data(); }
  void* v_pool() const { return v_pool_.data(); }
  int64_t pool_bytes() const;

 private:
  CudaBackend(const CacheGeometry& g, int device, int32_t max_batch, const PartialKernel* partial,
              std::vector<KvScale> scales);
  Status init();

  CacheGeometry geometry_;
  int device_ = 0;
  int32_t max_batch_ = 0;
  const PartialKernel* partial_ = nullptr;
  std::vector<KvScale> scales_;  // [num_layers]
  std::string device_name_;
  int32_t num_workers_ = 1;
  DeviceBuffer k_pool_;  // [layers][blocks][kv_heads][block_size][head_dim]
  DeviceBuffer v_pool_;
};

// The sizes a decode launch stages, computes and returns.
struct DecodeShape {
  int32_t batch = 0;
  int32_t rows = 0;          // query rows (DecodeLaunch::total_rows)
  int32_t num_q_heads = 0;
  int64_t block_ids = 0;     // table entries
  int64_t items = 0;         // work items
  int64_t members = 0;       // sequences over all items (a shared chunk counts each)
  int64_t partial_rows = 0;  // partial states
  size_t q_bytes = 0;
};

class CudaStream final : public BackendStream {
 public:
  static StatusOr<std::unique_ptr<CudaStream>> create(CudaBackend& backend);
  ~CudaStream() override;

  Status write_kv(std::span<const KvWrite> writes) override;
  Status read_kv(int32_t layer, std::span<const int64_t> slots, void* k, void* v) override;
  Status write_kv_raw(int32_t layer, std::span<const int64_t> slots, const void* k, const void* v) override;
  Status copy_block(int32_t src, int32_t dst) override;
  Status poison_blocks(std::span<const int32_t> blocks) override;
  Status decode(const DecodeLaunch& launch, DecodeOutputs& outputs) override;
  StatusOr<double> measure_memory_bandwidth(int64_t bytes) override;

  // Both pools copied to the host as stored (tests and debugging).
  Status read_pools(std::vector<unsigned char>* k, std::vector<unsigned char>* v);

 private:
  explicit CudaStream(CudaBackend& backend) : backend_(backend) {}
  Status init();
  // Sizes every workspace for a launch of `shape` (grows only past a high-water mark).
  Status reserve_decode(const DecodeShape& shape);
  Status reserve_append(size_t bytes);
  // read_kv and write_kv_raw: one 2-D copy per KV head per run of consecutive
  // slots in one block (host rows [slot][head][dim], device [head][slot][dim]).
  Status copy_rows(int32_t layer, std::span<const int64_t> slots, void* k, void* v, bool to_device);

  CudaBackend& backend_;
  DecodePlan plan_;  // the current launch's, reused
  cudaStream_t stream_ = nullptr;
  // Timing marks of a decode: copy in, partial, merge, copy out.
  cudaEvent_t ev_copy_in_ = nullptr;
  cudaEvent_t ev_partial_ = nullptr;
  cudaEvent_t ev_merge_ = nullptr;
  cudaEvent_t ev_done_ = nullptr;
  cudaEvent_t ev_copy_out_ = nullptr;

  PinnedBuffer staging_in_;  // q + tables + work list, packed for one copy
  DeviceBuffer device_in_;
  DeviceBuffer partials_;     // fp32 acc, m, l per (item, query row, query head)
  DeviceBuffer device_out_;   // out (q dtype) + lse
  PinnedBuffer staging_out_;
  PinnedBuffer append_staging_;  // slots + k + v of every write of a write_kv call
  DeviceBuffer append_device_;
  DeviceBuffer saturated_device_;  // fp8: one counter per write of a write_kv call
  PinnedBuffer saturated_host_;
};

}  // namespace pagoda::cuda
