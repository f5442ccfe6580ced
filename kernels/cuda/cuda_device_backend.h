#pragma once
// The CUDA backend: the K/V pools in device memory (one cudaMalloc each), one
// stream, and workspaces preallocated from max_batch and the pool's context so
// that a steady-state decode allocates nothing. Calls are serialised by a mutex;
// each one is synchronous (it returns when its results are on the host).

#include <cuda_runtime_api.h>

#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "cuda/device_memory.h"
#include "cuda/kernel_params.h"
#include "pagoda/backend.h"

namespace pagoda::cuda {

class CudaBackend final : public Backend {
 public:
  static StatusOr<std::unique_ptr<CudaBackend>> create(const BackendOptions& options);
  ~CudaBackend() override;

  std::string name() const override { return "cuda"; }
  std::string device_name() const override { return device_name_; }
  const CacheGeometry& geometry() const override { return geometry_; }
  int32_t num_workers() const override { return num_workers_; }

  Status write_kv(const KvWrite& w) override;
  Status copy_block(int32_t src, int32_t dst) override;
  Status poison_blocks(const int32_t* blocks, int32_t count) override;
  Status decode(const DecodeLaunch& launch, DecodeOutputs& outputs) override;
  StatusOr<double> measure_memory_bandwidth(int64_t bytes) override;

  // Both pools copied to the host as stored (tests and debugging).
  Status read_pools(std::vector<unsigned char>* k, std::vector<unsigned char>* v);

 private:
  CudaBackend(const CacheGeometry& g, int device, const PartialKernel* partial);
  Status init(int32_t max_batch);
  // Sizes every workspace for `batch` sequences, `block_ids` table entries,
  // `items` work items and `q_bytes` of queries (grows only past a high-water mark).
  Status reserve_decode(int32_t batch, int64_t block_ids, int64_t items, size_t q_bytes);
  Status reserve_append(int64_t tokens, size_t row_bytes);
  int64_t pool_bytes() const;

  std::mutex mu_;
  CacheGeometry geometry_;
  int device_ = 0;
  const PartialKernel* partial_ = nullptr;
  std::string device_name_;
  int32_t num_workers_ = 1;

  cudaStream_t stream_ = nullptr;
  // Timing marks of a decode: copy in, partial, merge, copy out.
  cudaEvent_t ev_copy_in_ = nullptr;
  cudaEvent_t ev_partial_ = nullptr;
  cudaEvent_t ev_merge_ = nullptr;
  cudaEvent_t ev_done_ = nullptr;
  cudaEvent_t ev_copy_out_ = nullptr;

  DeviceBuffer k_pool_;  // [layers][blocks][kv_heads][block_size][head_dim]
  DeviceBuffer v_pool_;
  PinnedBuffer staging_in_;  // q + tables + work list, packed for one copy
  DeviceBuffer device_in_;
  DeviceBuffer partials_;     // fp32 acc, m, l per (item, query head)
  DeviceBuffer device_out_;   // out (q dtype) + lse
  PinnedBuffer staging_out_;
  PinnedBuffer append_staging_;  // slots + k + v of a write_kv
  DeviceBuffer append_device_;
};

}  // namespace pagoda::cuda
