// A CUDA stream's request paths: write_kv (stage, one copy in, append kernels)
// and decode (stage, copy in, partial + merge kernels, copy out). Inputs and
// outputs travel through the stream's pinned staging buffers, each direction
// packed into one copy. Inputs come validated from the cache manager and the
// rpc layer; debug builds assert what the kernels rely on.
#include <cassert>
#include <cmath>
#include <cstring>
#include <limits>

#include "cuda/cuda_check.h"
#include "cuda/cuda_device_backend.h"
#include "cuda/work_list.h"
#include "pagoda/softmax_state.h"

namespace pagoda::cuda {
namespace {

// Byte offsets of the decode inputs packed into one buffer.
struct InputLayout {
  size_t q = 0;
  size_t block_indptr = 0;  // [batch + 1]
  size_t block_ids = 0;     // [block_indptr[batch]]
  size_t lengths = 0;       // [batch]
  size_t q_indptr = 0;      // [batch + 1]
  size_t row_seq = 0;       // [rows]
  size_t item_indptr = 0;   // [batch + 1]
  size_t item_seq = 0;      // [items]
  size_t item_chunk = 0;    // [items]
  size_t item_partial = 0;  // [items]
  size_t sinks = 0;         // [num_q_heads]
  size_t total = 0;

  InputLayout(const DecodeShape& s) {
    const size_t ints = sizeof(int32_t);
    const auto batch = static_cast<size_t>(s.batch);
    const auto items = static_cast<size_t>(s.items);
    block_indptr = align_up(s.q_bytes);
    block_ids = align_up(block_indptr + (batch + 1) * ints);
    lengths = align_up(block_ids + static_cast<size_t>(s.block_ids) * ints);
    q_indptr = align_up(lengths + batch * ints);
    row_seq = align_up(q_indptr + (batch + 1) * ints);
    item_indptr = align_up(row_seq + static_cast<size_t>(s.rows) * ints);
    item_seq = align_up(item_indptr + (batch + 1) * ints);
    item_chunk = align_up(item_seq + items * ints);
    item_partial = align_up(item_chunk + items * ints);
    sinks = align_up(item_partial + items * ints);
    total = align_up(sinks + static_cast<size_t>(s.num_q_heads) * sizeof(float));
  }
};

// Partial states: acc [partial rows, head_dim], m and l [partial rows].
struct PartialLayout {
  size_t acc = 0;
  size_t m = 0;
  size_t l = 0;
  size_t total = 0;

  PartialLayout(const DecodeShape& s, const CacheGeometry& g) {
    const auto rows = static_cast<size_t>(s.partial_rows);
    m = align_up(rows * g.head_dim * sizeof(float));
    l = align_up(m + rows * sizeof(float));
    total = align_up(l + rows * sizeof(float));
  }
};

// Outputs: out [rows, q_heads, head_dim] in q's dtype, then lse [rows, q_heads].
struct OutputLayout {
  size_t out = 0;
  size_t lse = 0;
  size_t total = 0;

  OutputLayout(const DecodeShape& s, const CacheGeometry& g, size_t out_elem) {
    const size_t rows = static_cast<size_t>(s.rows) * g.num_q_heads;
    lse = align_up(rows * g.head_dim * out_elem);
    total = align_up(lse + rows * sizeof(float));
  }
};

template <typename T>
T* at(const void* base, size_t offset) {
  return reinterpret_cast<T*>(static_cast<unsigned char*>(const_cast<void*>(base)) + offset);
}

double elapsed_seconds(cudaEvent_t from, cudaEvent_t to, Status* status) {
  float ms = 0.f;
  const cudaError_t err = cudaEventElapsedTime(&ms, from, to);
  if (err != cudaSuccess && status->ok()) {
    *status = cuda_error_status(err, "cudaEventElapsedTime", __FILE__, __LINE__);
  }
  return ms * 1e-3;
}

}  // namespace

Status CudaStream::reserve_decode(const DecodeShape& shape) {
  const InputLayout in(shape);
  PAGODA_RETURN_IF_ERROR(staging_in_.reserve(in.total));
  PAGODA_RETURN_IF_ERROR(device_in_.reserve(in.total));
  PAGODA_RETURN_IF_ERROR(partials_.reserve(PartialLayout(shape, backend_.geometry()).total));
  const OutputLayout out(shape, backend_.geometry(), sizeof(float));
  PAGODA_RETURN_IF_ERROR(device_out_.reserve(out.total));
  PAGODA_RETURN_IF_ERROR(staging_out_.reserve(out.total));
  return Status::Ok();
}

Status CudaStream::reserve_append(size_t bytes) {
  PAGODA_RETURN_IF_ERROR(append_staging_.reserve(bytes));
  PAGODA_RETURN_IF_ERROR(append_device_.reserve(bytes));
  return Status::Ok();
}

Status CudaStream::write_kv(std::span<const KvWrite> writes) {
  const CacheGeometry& g = backend_.geometry();
  // Every write's slots, k and v packed into one staging buffer: one copy in.
  size_t total = 0;
  for (const KvWrite& w : writes) {
    assert(w.layer >= 0 && w.layer < g.num_layers && known_dtype(w.dtype));
    const size_t kv_bytes = static_cast<size_t>(w.num_tokens) * g.num_kv_heads * g.head_dim * dtype_size(w.dtype);
    total += align_up(static_cast<size_t>(w.num_tokens) * sizeof(int64_t)) + 2 * align_up(kv_bytes);
  }
  if (total == 0) return Status::Ok();
  PAGODA_CUDA_RETURN_IF_ERROR(cudaSetDevice(backend_.device()));
  PAGODA_RETURN_IF_ERROR(reserve_append(total));
  unsigned char* host = append_staging_.data();
  size_t offset = 0;
  for (const KvWrite& w : writes) {
    const size_t kv_bytes = static_cast<size_t>(w.num_tokens) * g.num_kv_heads * g.head_dim * dtype_size(w.dtype);
    std::memcpy(host + offset, w.slots, w.num_tokens * sizeof(int64_t));
    offset += align_up(static_cast<size_t>(w.num_tokens) * sizeof(int64_t));
    std::memcpy(host + offset, w.k, kv_bytes);
    offset += align_up(kv_bytes);
    std::memcpy(host + offset, w.v, kv_bytes);
    offset += align_up(kv_bytes);
  }
  void* dev = append_device_.data();
  PAGODA_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(dev, host, total, cudaMemcpyHostToDevice, stream_));
  // fp8: one saturation counter per write, zeroed here and read back below.
  const bool count_saturation = is_fp8(g.dtype);
  auto* counters = static_cast<unsigned long long*>(nullptr);
  const size_t counter_bytes = writes.size() * sizeof(unsigned long long);
  if (count_saturation) {
    PAGODA_RETURN_IF_ERROR(saturated_device_.reserve(counter_bytes));
    PAGODA_RETURN_IF_ERROR(saturated_host_.reserve(counter_bytes));
    counters = static_cast<unsigned long long*>(saturated_device_.data());
    PAGODA_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(counters, 0, counter_bytes, stream_));
  }
  offset = 0;
  for (size_t i = 0; i < writes.size(); ++i) {
    const KvWrite& w = writes[i];
    const size_t kv_bytes = static_cast<size_t>(w.num_tokens) * g.num_kv_heads * g.head_dim * dtype_size(w.dtype);
    AppendParams p;
    p.geometry = g;
    p.k_pool = backend_.k_pool();
    p.v_pool = backend_.v_pool();
    p.layer = w.layer;
    p.num_tokens = w.num_tokens;
    p.slots = at<const int64_t>(dev, offset);
    offset += align_up(static_cast<size_t>(w.num_tokens) * sizeof(int64_t));
    p.k = at<const void>(dev, offset);
    offset += align_up(kv_bytes);
    p.v = at<const void>(dev, offset);
    offset += align_up(kv_bytes);
    p.in_dtype = w.dtype;
    p.k_scale = backend_.kv_scale(w.layer).k;
    p.v_scale = backend_.kv_scale(w.layer).v;
    p.saturated = count_saturation ? counters + i : nullptr;
    PAGODA_CUDA_RETURN_IF_ERROR(launch_append(p, stream_));
  }
  if (count_saturation) {
    PAGODA_CUDA_RETURN_IF_ERROR(
        cudaMemcpyAsync(saturated_host_.data(), counters, counter_bytes, cudaMemcpyDeviceToHost, stream_));
  }
  PAGODA_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream_));
  if (count_saturation) {
    const auto* counted = reinterpret_cast<const unsigned long long*>(saturated_host_.data());
    for (size_t i = 0; i < writes.size(); ++i) {
      if (writes[i].saturated != nullptr) *writes[i].saturated += static_cast<int64_t>(counted[i]);
    }
  }
  return Status::Ok();
}

Status CudaStream::decode(const DecodeLaunch& launch, DecodeOutputs& outputs) {
  const CacheGeometry& g = backend_.geometry();
  const BatchBlockTables& t = launch.tables;
  const int32_t batch = t.batch;
  assert(launch.layer >= 0 && launch.layer < g.num_layers);
  assert(std::isfinite(launch.scale) && launch.scale > 0.f && launch.split_tokens > 0);
  assert(batch == 0 || (launch.q != nullptr && outputs.out != nullptr));
  const int32_t chunk = launch_chunk_tokens(launch, g, backend_.num_workers());
  outputs.chunk_tokens = chunk;
  outputs.attention_seconds = outputs.merge_seconds = outputs.transfer_seconds = 0;

  DecodeShape shape;
  shape.batch = batch;
  shape.rows = launch.total_rows();
  shape.num_q_heads = g.num_q_heads;
  shape.block_ids = batch > 0 ? t.block_indptr[batch] : 0;
  const WorkListSize work = size_work_list(launch, g.num_q_heads, chunk);
  shape.items = work.items;
  shape.partial_rows = work.partial_rows;
  constexpr int64_t kMaxIndex = std::numeric_limits<int32_t>::max();
  if (work.items > kMaxIndex || work.partial_rows > kMaxIndex) {
    return InvalidArgument(
        "split_tokens: expected a chunk length giving < 2^31 work items and partial states, received {} "
        "({} items, {} partial states)",
        chunk, work.items, work.partial_rows);
  }
  if (batch == 0) return Status::Ok();
  PAGODA_CUDA_RETURN_IF_ERROR(cudaSetDevice(backend_.device()));

  const size_t q_elem = dtype_size(launch.q_dtype);
  shape.q_bytes = static_cast<size_t>(shape.rows) * g.num_q_heads * g.head_dim * q_elem;
  PAGODA_RETURN_IF_ERROR(reserve_decode(shape));
  const InputLayout in(shape);
  const PartialLayout part(shape, g);
  const OutputLayout out(shape, g, q_elem);

  // Stage the inputs; the row map and the work list are written straight into
  // pinned memory.
  unsigned char* host = staging_in_.data();
  std::memcpy(host + in.q, launch.q, shape.q_bytes);
  std::memcpy(host + in.block_indptr, t.block_indptr, (batch + 1) * sizeof(int32_t));
  if (shape.block_ids > 0) std::memcpy(host + in.block_ids, t.block_ids, shape.block_ids * sizeof(int32_t));
  std::memcpy(host + in.lengths, t.lengths, batch * sizeof(int32_t));
  int32_t* q_indptr = at<int32_t>(host, in.q_indptr);
  int32_t* row_seq = at<int32_t>(host, in.row_seq);
  for (int32_t b = 0; b <= batch; ++b) q_indptr[b] = b < batch ? launch.first_row(b) : shape.rows;
  for (int32_t b = 0; b < batch; ++b) {
    for (int32_t r = q_indptr[b]; r < q_indptr[b + 1]; ++r) row_seq[r] = b;
  }
  const auto items = static_cast<size_t>(shape.items);
  WorkListArrays arrays;
  arrays.item_seq = {at<int32_t>(host, in.item_seq), items};
  arrays.item_chunk = {at<int32_t>(host, in.item_chunk), items};
  arrays.item_partial = {at<int32_t>(host, in.item_partial), items};
  arrays.item_indptr = {at<int32_t>(host, in.item_indptr), static_cast<size_t>(batch) + 1};
  if (outputs.splits != nullptr) arrays.splits = {outputs.splits, static_cast<size_t>(batch)};
  fill_work_list(launch, g.num_q_heads, chunk, arrays);
  // Sinks in base 2, rounded as the CPU backend rounds them.
  float* sinks_log2 = at<float>(host, in.sinks);
  if (launch.sinks != nullptr) {
    for (int32_t h = 0; h < g.num_q_heads; ++h) sinks_log2[h] = static_cast<float>(launch.sinks[h] * kLog2e);
  }

  void* dev = device_in_.data();
  PAGODA_CUDA_RETURN_IF_ERROR(cudaEventRecord(ev_copy_in_, stream_));
  PAGODA_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(dev, host, in.total, cudaMemcpyHostToDevice, stream_));

  PartialParams p;
  p.geometry = g;
  p.k_pool = backend_.k_pool();
  p.v_pool = backend_.v_pool();
  p.layer = launch.layer;
  p.tables.batch = batch;
  p.tables.block_indptr = at<const int32_t>(dev, in.block_indptr);
  p.tables.block_ids = at<const int32_t>(dev, in.block_ids);
  p.tables.lengths = at<const int32_t>(dev, in.lengths);
  p.work.num_items = static_cast<int32_t>(shape.items);
  p.work.chunk_tokens = chunk;
  p.work.item_seq = at<const int32_t>(dev, in.item_seq);
  p.work.item_chunk = at<const int32_t>(dev, in.item_chunk);
  p.work.item_indptr = at<const int32_t>(dev, in.item_indptr);
  p.work.item_partial = at<const int32_t>(dev, in.item_partial);
  p.variant.q_indptr = at<const int32_t>(dev, in.q_indptr);
  p.variant.sliding_window = launch.sliding_window;
  if (launch.soft_cap > 0.f) {
    p.variant.soft_cap = launch.soft_cap;
    p.variant.inv_soft_cap = 1.f / launch.soft_cap;
    p.variant.soft_cap_log2 = launch.soft_cap * static_cast<float>(kLog2e);
  }
  p.q = at<const void>(dev, in.q);
  p.q_dtype = launch.q_dtype;
  // The layer's K scale folds into q's factor, its V scale into the merge's 1 / l.
  const KvScale kv = backend_.kv_scale(launch.layer);
  p.q_scale = (launch.soft_cap > 0.f ? launch.scale : scale_log2(launch.scale)) * kv.k;
  void* ws = partials_.data();
  p.partials = {at<float>(ws, part.acc), at<float>(ws, part.m), at<float>(ws, part.l)};

  MergeParams m;
  m.rows = shape.rows;
  m.num_q_heads = g.num_q_heads;
  m.head_dim = g.head_dim;
  m.q_indptr = p.variant.q_indptr;
  m.row_seq = at<const int32_t>(dev, in.row_seq);
  m.item_indptr = p.work.item_indptr;
  m.item_partial = p.work.item_partial;
  m.sinks_log2 = launch.sinks != nullptr ? at<const float>(dev, in.sinks) : nullptr;
  m.acc = p.partials.acc;
  m.m = p.partials.m;
  m.l = p.partials.l;
  m.out = at<void>(device_out_.data(), out.out);
  m.out_dtype = launch.q_dtype;
  m.lse = at<float>(device_out_.data(), out.lse);
  m.out_scale = kv.v;

  PAGODA_CUDA_RETURN_IF_ERROR(cudaEventRecord(ev_partial_, stream_));
  PAGODA_CUDA_RETURN_IF_ERROR(backend_.partial_kernel().launch(p, stream_));
  PAGODA_CUDA_RETURN_IF_ERROR(cudaEventRecord(ev_merge_, stream_));
  PAGODA_CUDA_RETURN_IF_ERROR(launch_merge(m, stream_));
  PAGODA_CUDA_RETURN_IF_ERROR(cudaEventRecord(ev_done_, stream_));
  PAGODA_CUDA_RETURN_IF_ERROR(
      cudaMemcpyAsync(staging_out_.data(), device_out_.data(), out.total, cudaMemcpyDeviceToHost, stream_));
  PAGODA_CUDA_RETURN_IF_ERROR(cudaEventRecord(ev_copy_out_, stream_));
  PAGODA_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream_));

  const size_t rows = static_cast<size_t>(shape.rows) * g.num_q_heads;
  std::memcpy(outputs.out, staging_out_.data() + out.out, rows * g.head_dim * q_elem);
  if (outputs.lse != nullptr) std::memcpy(outputs.lse, staging_out_.data() + out.lse, rows * sizeof(float));
  Status status;
  outputs.attention_seconds = elapsed_seconds(ev_partial_, ev_done_, &status);
  outputs.merge_seconds = elapsed_seconds(ev_merge_, ev_done_, &status);
  outputs.transfer_seconds =
      elapsed_seconds(ev_copy_in_, ev_partial_, &status) + elapsed_seconds(ev_done_, ev_copy_out_, &status);
  return status;
}

}  // namespace pagoda::cuda
