// Creation of the CUDA backend and its streams, and the streams' block-level
// operations (copy, poison, bandwidth baseline). Decode and append live in
// cuda_decode.cc.
#include "cuda/cuda_backend.h"

#include <algorithm>
#include <cassert>
#include <utility>
#include <vector>

#include "cuda/cuda_check.h"
#include "cuda/cuda_device_backend.h"
#include "cuda/decode_dispatch.h"
#include "pagoda/geometry_rules.h"
#include "pagoda/split_plan.h"

namespace pagoda::cuda {

bool device_available() {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    (void)cudaGetLastError();
    return false;
  }
  return count > 0;
}

StatusOr<std::unique_ptr<Backend>> make_backend(const BackendOptions& options) {
  auto backend = CudaBackend::create(options);
  if (!backend.ok()) return backend.status();
  return std::unique_ptr<Backend>(std::move(backend.value()));
}

StatusOr<std::unique_ptr<CudaBackend>> CudaBackend::create(const BackendOptions& options) {
  // Shape errors first: they are the caller's, with or without a GPU.
  PAGODA_RETURN_IF_ERROR(validate_geometry(options.geometry));
  PAGODA_RETURN_IF_ERROR(validate_kv_scales(options.kv_scales, options.geometry.num_layers));
  if (options.geometry.num_kv_heads > 65535) {  // the partial kernel's grid.y
    return InvalidArgument("num_kv_heads: expected at most 65535 on the CUDA backend, received {}",
                           options.geometry.num_kv_heads);
  }
  if (options.max_batch <= 0) {
    return InvalidArgument("max_batch: expected > 0, received {}", options.max_batch);
  }
  auto partial = find_partial_kernel(options.geometry.dtype, options.geometry.head_dim);
  if (!partial.ok()) return partial.status();

  int count = 0;
  const cudaError_t err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess || count == 0) {
    (void)cudaGetLastError();
    return Unavailable("backend 'cuda': expected a usable CUDA device, received {} ({})",
                       err == cudaSuccess ? "no device" : cudaGetErrorName(err),
                       err == cudaSuccess ? "cudaGetDeviceCount reported 0 devices" : cudaGetErrorString(err));
  }
  if (options.cuda_device < 0 || options.cuda_device >= count) {
    return InvalidArgument("cuda_device: expected 0..{}, received {}", count - 1, options.cuda_device);
  }
  std::vector<KvScale> scales = options.kv_scales;
  if (scales.empty()) scales.assign(static_cast<size_t>(options.geometry.num_layers), KvScale{});
  std::unique_ptr<CudaBackend> backend(new CudaBackend(options.geometry, options.cuda_device, options.max_batch,
                                                       partial.value(), std::move(scales)));
  PAGODA_RETURN_IF_ERROR(backend->init());
  return backend;
}

CudaBackend::CudaBackend(const CacheGeometry& g, int device, int32_t max_batch, const PartialKernel* partial,
                         std::vector<KvScale> scales)
    : geometry_(g), device_(device), max_batch_(max_batch), partial_(partial), scales_(std::move(scales)) {}

int64_t CudaBackend::pool_bytes() const {
  return geometry_.pool_elements() * static_cast<int64_t>(dtype_size(geometry_.dtype));
}

Status CudaBackend::init() {
  PAGODA_CUDA_RETURN_IF_ERROR(cudaSetDevice(device_));
  cudaDeviceProp prop{};
  PAGODA_CUDA_RETURN_IF_ERROR(cudaGetDeviceProperties(&prop, device_));
  device_name_ = prop.name;
  int ctas_per_sm = 0;
  PAGODA_CUDA_RETURN_IF_ERROR(partial_->ctas_per_sm(&ctas_per_sm));
  num_workers_ = prop.multiProcessorCount * (ctas_per_sm > 0 ? ctas_per_sm : 1);
  PAGODA_RETURN_IF_ERROR(k_pool_.allocate(static_cast<size_t>(pool_bytes())));
  // Latent attention has no V pool: V is the prefix of each K row.
  if (!geometry_.latent()) PAGODA_RETURN_IF_ERROR(v_pool_.allocate(static_cast<size_t>(pool_bytes())));
  return Status::Ok();
}

StatusOr<std::unique_ptr<BackendStream>> CudaBackend::open_stream() {
  auto stream = CudaStream::create(*this);
  if (!stream.ok()) return stream.status();
  return std::unique_ptr<BackendStream>(std::move(stream.value()));
}

StatusOr<std::unique_ptr<CudaStream>> CudaStream::create(CudaBackend& backend) {
  std::unique_ptr<CudaStream> s(new CudaStream(backend));
  PAGODA_RETURN_IF_ERROR(s->init());
  return s;
}

Status CudaStream::init() {
  PAGODA_CUDA_RETURN_IF_ERROR(cudaSetDevice(backend_.device()));
  PAGODA_CUDA_RETURN_IF_ERROR(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
  for (cudaEvent_t* e : {&ev_copy_in_, &ev_partial_, &ev_merge_, &ev_done_, &ev_copy_out_}) {
    PAGODA_CUDA_RETURN_IF_ERROR(cudaEventCreate(e));
  }
  // Workspaces for the largest batch over the whole pool without sharing: at
  // most one work item per kMinFastChunkTokens tokens plus one per sequence.
  const CacheGeometry& g = backend_.geometry();
  const int32_t max_batch = backend_.max_batch();
  const int64_t context = static_cast<int64_t>(g.num_blocks) * g.block_size;
  // One query row per sequence: multi-row launches grow the workspaces.
  DecodeShape shape;
  shape.batch = shape.rows = max_batch;
  shape.num_q_heads = g.num_q_heads;
  shape.block_ids = g.num_blocks + int64_t{max_batch};
  shape.items = max_batch + (context + kMinFastChunkTokens - 1) / kMinFastChunkTokens;
  shape.partial_rows = shape.items * g.num_q_heads;
  shape.q_bytes = static_cast<size_t>(max_batch) * g.num_q_heads * g.head_dim * sizeof(float);
  PAGODA_RETURN_IF_ERROR(reserve_decode(shape));
  // One new token per sequence per step, in fp32 at most.
  const size_t row_bytes = static_cast<size_t>(g.num_kv_heads) * g.head_dim * sizeof(float);
  PAGODA_RETURN_IF_ERROR(reserve_append(align_up(static_cast<size_t>(max_batch) * sizeof(int64_t)) +
                                        2 * align_up(static_cast<size_t>(max_batch) * row_bytes)));
  return Status::Ok();
}

CudaStream::~CudaStream() {
  (void)cudaSetDevice(backend_.device());
  if (stream_ != nullptr) (void)cudaStreamSynchronize(stream_);
  for (cudaEvent_t e : {ev_copy_in_, ev_partial_, ev_merge_, ev_done_, ev_copy_out_}) {
    if (e != nullptr) (void)cudaEventDestroy(e);
  }
  if (stream_ != nullptr) (void)cudaStreamDestroy(stream_);
}

Status CudaStream::copy_rows(int32_t layer, std::span<const int64_t> slots, void* k, void* v, bool to_device) {
  const CacheGeometry& g = backend_.geometry();
  PAGODA_CUDA_RETURN_IF_ERROR(cudaSetDevice(backend_.device()));
  const size_t elem = dtype_size(g.dtype);
  const size_t row = static_cast<size_t>(g.head_dim) * elem;
  const size_t host_pitch = row * static_cast<size_t>(g.num_kv_heads);
  void* pools[2] = {backend_.k_pool(), backend_.v_pool()};
  void* hosts[2] = {k, v};
  const int num_pools = g.latent() ? 1 : 2;  // latent attention: K rows alone
  for (size_t first = 0; first < slots.size();) {
    const int64_t block = slots[first] / g.block_size;
    size_t last = first + 1;
    while (last < slots.size() && slots[last] == slots[last - 1] + 1 && slots[last] / g.block_size == block) ++last;
    const auto slot = static_cast<int32_t>(slots[first] % g.block_size);
    for (int32_t h = 0; h < g.num_kv_heads; ++h) {
      const size_t device_at =
          static_cast<size_t>(g.element_offset(layer, static_cast<int32_t>(block), h, slot)) * elem;
      const size_t host_at = first * host_pitch + static_cast<size_t>(h) * row;
      for (int p = 0; p < num_pools; ++p) {
        auto* device = static_cast<unsigned char*>(pools[p]) + device_at;
        auto* host = static_cast<unsigned char*>(hosts[p]) + host_at;
        if (to_device) {
          PAGODA_CUDA_RETURN_IF_ERROR(cudaMemcpy2DAsync(device, row, host, host_pitch, row, last - first,
                                                        cudaMemcpyHostToDevice, stream_));
        } else {
          PAGODA_CUDA_RETURN_IF_ERROR(cudaMemcpy2DAsync(host, host_pitch, device, row, row, last - first,
                                                        cudaMemcpyDeviceToHost, stream_));
        }
      }
    }
    first = last;
  }
  PAGODA_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream_));
  return Status::Ok();
}

Status CudaStream::read_kv(int32_t layer, std::span<const int64_t> slots, void* k, void* v) {
  return copy_rows(layer, slots, k, v, false);
}

Status CudaStream::write_kv_raw(int32_t layer, std::span<const int64_t> slots, const void* k, const void* v) {
  return copy_rows(layer, slots, const_cast<void*>(k), const_cast<void*>(v), true);
}

Status CudaStream::copy_block(int32_t src, int32_t dst) {
  const CacheGeometry& g = backend_.geometry();
  assert(src >= 0 && src < g.num_blocks && dst >= 0 && dst < g.num_blocks);
  if (src == dst) return Status::Ok();
  PAGODA_CUDA_RETURN_IF_ERROR(cudaSetDevice(backend_.device()));
  const size_t elem = dtype_size(g.dtype);
  const size_t block_bytes = static_cast<size_t>(g.block_stride()) * elem;
  for (void* pool : {backend_.k_pool(), backend_.v_pool()}) {
    if (pool == nullptr) continue;  // no V pool under latent attention
    auto* base = static_cast<unsigned char*>(pool);
    for (int32_t layer = 0; layer < g.num_layers; ++layer) {
      const size_t from = static_cast<size_t>(g.element_offset(layer, src, 0, 0)) * elem;
      const size_t to = static_cast<size_t>(g.element_offset(layer, dst, 0, 0)) * elem;
      PAGODA_CUDA_RETURN_IF_ERROR(
          cudaMemcpyAsync(base + to, base + from, block_bytes, cudaMemcpyDeviceToDevice, stream_));
    }
  }
  PAGODA_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream_));
  return Status::Ok();
}

Status CudaStream::poison_blocks(std::span<const int32_t> blocks) {
  const CacheGeometry& g = backend_.geometry();
  PAGODA_CUDA_RETURN_IF_ERROR(cudaSetDevice(backend_.device()));
  // Runs of consecutive ids become one memset per layer (tests poison whole pools).
  std::vector<int32_t> ids(blocks.begin(), blocks.end());
  std::sort(ids.begin(), ids.end());
  ids.erase(std::unique(ids.begin(), ids.end()), ids.end());
  assert(ids.empty() || (ids.front() >= 0 && ids.back() < g.num_blocks));
  const size_t elem = dtype_size(g.dtype);
  const size_t block_bytes = static_cast<size_t>(g.block_stride()) * elem;
  for (size_t first = 0; first < ids.size();) {
    size_t last = first + 1;
    while (last < ids.size() && ids[last] == ids[last - 1] + 1) ++last;
    for (void* pool : {backend_.k_pool(), backend_.v_pool()}) {
      if (pool == nullptr) continue;  // no V pool under latent attention
      auto* base = static_cast<unsigned char*>(pool);
      for (int32_t layer = 0; layer < g.num_layers; ++layer) {
        const size_t at = static_cast<size_t>(g.element_offset(layer, ids[first], 0, 0)) * elem;
        // All-ones bytes are a NaN in fp32, fp16 and bf16 alike.
        PAGODA_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(base + at, 0xFF, block_bytes * (last - first), stream_));
      }
    }
    first = last;
  }
  PAGODA_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream_));
  return Status::Ok();
}

StatusOr<double> CudaStream::measure_memory_bandwidth(int64_t bytes) {
  if (bytes <= 0) return InvalidArgument("bytes: expected > 0, received {}", bytes);
  PAGODA_CUDA_RETURN_IF_ERROR(cudaSetDevice(backend_.device()));
  DeviceBuffer src;
  DeviceBuffer dst;
  PAGODA_RETURN_IF_ERROR(src.allocate(static_cast<size_t>(bytes)));
  PAGODA_RETURN_IF_ERROR(dst.allocate(static_cast<size_t>(bytes)));
  PAGODA_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(src.data(), 0x3C, bytes, stream_));
  constexpr int kReps = 5;
  float best_ms = 0.f;
  for (int rep = -1; rep < kReps; ++rep) {  // rep -1 warms up
    PAGODA_CUDA_RETURN_IF_ERROR(cudaEventRecord(ev_copy_in_, stream_));
    PAGODA_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(dst.data(), src.data(), bytes, cudaMemcpyDeviceToDevice, stream_));
    PAGODA_CUDA_RETURN_IF_ERROR(cudaEventRecord(ev_done_, stream_));
    PAGODA_CUDA_RETURN_IF_ERROR(cudaEventSynchronize(ev_done_));
    float ms = 0.f;
    PAGODA_CUDA_RETURN_IF_ERROR(cudaEventElapsedTime(&ms, ev_copy_in_, ev_done_));
    if (rep >= 0 && (best_ms == 0.f || ms < best_ms)) best_ms = ms;
  }
  if (best_ms <= 0.f) return Internal("measure_memory_bandwidth: copy time was {} ms", best_ms);
  // The figure is only worth something if the copy happened: three windows of
  // the destination must hold the source's bytes.
  const size_t total = static_cast<size_t>(bytes);
  const size_t window = std::min<size_t>(total, size_t{1} << 20);
  std::vector<unsigned char> seen(window);
  for (size_t at : {size_t{0}, (total - window) / 2, total - window}) {
    PAGODA_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(seen.data(), static_cast<unsigned char*>(dst.data()) + at, window,
                                                cudaMemcpyDeviceToHost, stream_));
    PAGODA_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream_));
    for (size_t i = 0; i < window; ++i) {
      if (seen[i] != 0x3C) {
        return Internal("measure_memory_bandwidth: destination byte {}: expected 0x3c after the copy, received {:#x}",
                        at + i, seen[i]);
      }
    }
  }
  // A copy reads and writes every byte.
  return 2.0 * static_cast<double>(bytes) / (best_ms * 1e-3);
}

Status CudaStream::read_pools(std::vector<unsigned char>* k, std::vector<unsigned char>* v) {
  PAGODA_CUDA_RETURN_IF_ERROR(cudaSetDevice(backend_.device()));
  const size_t bytes = static_cast<size_t>(backend_.pool_bytes());
  k->resize(bytes);
  v->resize(backend_.v_pool() != nullptr ? bytes : 0);  // empty under latent attention
  PAGODA_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(k->data(), backend_.k_pool(), bytes, cudaMemcpyDeviceToHost, stream_));
  if (!v->empty()) {
    PAGODA_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(v->data(), backend_.v_pool(), bytes, cudaMemcpyDeviceToHost, stream_));
  }
  PAGODA_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream_));
  return Status::Ok();
}

}  // namespace pagoda::cuda
