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
#include "pagoda/softmax_state.h"

namespace pagoda::cuda {
namespace {

// Byte offsets of the decode inputs packed into one buffer.
struct InputLayout {
  size_t q = 0;
  size_t block_indptr = 0;     // [batch + 1]
  size_t block_ids = 0;        // [block_indptr[batch]]
  size_t lengths = 0;          // [batch]
  size_t q_indptr = 0;         // [batch + 1]
  size_t row_seq = 0;          // [rows]
  size_t item_chunk = 0;       // [items]
  size_t item_members = 0;     // [items + 1]
  size_t members = 0;          // [members]
  size_t seq_first_chunk = 0;  // [batch]
  size_t seq_chunks = 0;       // [batch]
  size_t seq_partial = 0;      // [batch]
  size_t sinks = 0;            // [num_q_heads]
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
    item_chunk = align_up(row_seq + static_cast<size_t>(s.rows) * ints);
    item_members = align_up(item_chunk + items * ints);
    members = align_up(item_members + (items + 1) * ints);
    seq_first_chunk = align_up(members + static_cast<size_t>(s.members) * ints);
    seq_chunks = align_up(seq_first_chunk + batch * ints);
    seq_partial = align_up(seq_chunks + batch * ints);
    sinks = align_up(seq_partial + batch * ints);
    total = align_up(sinks + static_cast<size_t>(s.num_q_heads) * sizeof(float));
  }
};

// Partial states: acc [partial rows, v_head_dim], m and l [partial rows].
struct PartialLayout {
  size_t acc = 0;
  size_t m = 0;
  size_t l = 0;
  size_t total = 0;

  PartialLayout(const DecodeShape& s, const CacheGeometry& g) {
    const auto rows = static_cast<size_t>(s.partial_rows);
    m = align_up(rows * g.v_dim() * sizeof(float));
    l = align_up(m + rows * sizeof(float));
    total = align_up(l + rows * sizeof(float));
  }
};

// Outputs: out [rows, q_heads, v_head_dim] in q's dtype, then lse [rows, q_heads].
struct OutputLayout {
  size_t out = 0;
  size_t lse = 0;
  size_t total = 0;

  OutputLayout(const DecodeShape& s, const CacheGeometry& g, size_t out_elem) {
    const size_t rows = static_cast<size_t>(s.rows) * g.num_q_heads;
    lse = align_up(rows * g.v_dim() * out_elem);
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

// The plan's arrays and the launch's tables, packed into pinned memory in the
// layout `in` gives (one copy in).
void stage_inputs(const DecodePlan& plan, const DecodeLaunch& launch, const DecodeShape& shape, const InputLayout& in,
                  unsigned char* host) {
  const BatchBlockTables& t = launch.tables;
  const int32_t batch = t.batch;
  std::memcpy(host + in.q, launch.q, shape.q_bytes);
  std::memcpy(host + in.block_indptr, t.block_indptr, (batch + 1) * sizeof(int32_t));
  if (shape.block_ids > 0) std::memcpy(host + in.block_ids, t.block_ids, shape.block_ids * sizeof(int32_t));
  std::memcpy(host + in.lengths, t.lengths, batch * sizeof(int32_t));
  int32_t* q_indptr = at<int32_t>(host, in.q_indptr);
  for (int32_t b = 0; b <= batch; ++b) q_indptr[b] = b < batch ? launch.first_row(b) : shape.rows;
  std::memcpy(at<int32_t>(host, in.row_seq), plan.row_sequence().data(), shape.rows * sizeof(int32_t));
  int32_t* item_chunk = at<int32_t>(host, in.item_chunk);
  int32_t* item_members = at<int32_t>(host, in.item_members);
  const std::span<const PlanItem> items = plan.items();
  for (size_t i = 0; i < items.size(); ++i) {
    item_chunk[i] = items[i].chunk;
    item_members[i] = items[i].first_member;
  }
  item_members[items.size()] = static_cast<int32_t>(plan.members().size());
  std::memcpy(at<int32_t>(host, in.members), plan.members().data(), plan.members().size() * sizeof(int32_t));
  int32_t* first_chunk = at<int32_t>(host, in.seq_first_chunk);
  int32_t* chunks = at<int32_t>(host, in.seq_chunks);
  int32_t* partial = at<int32_t>(host, in.seq_partial);
  for (int32_t b = 0; b < batch; ++b) {
    const PlanSequence& s = plan.sequences()[static_cast<size_t>(b)];
    first_chunk[b] = s.chunks.first;
    chunks[b] = s.chunks.count();
    partial[b] = static_cast<int32_t>(s.first_partial);  // below 2^31: decode checked the total
  }
  if (plan.constants().has_sinks) {
    std::memcpy(at<float>(host, in.sinks), plan.sinks_log2().data(), plan.sinks_log2().size() * sizeof(float));
  }
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
  // Every write's slots, k and v packed into one staging buffer: one copy in
  // (k alone under latent attention, whose V is K's prefix).
  const size_t parts = g.latent() ? 1 : 2;
  size_t total = 0;
  for (const KvWrite& w : writes) {
    assert(w.layer >= 0 && w.layer < g.num_layers && known_dtype(w.dtype));
    const size_t kv_bytes = static_cast<size_t>(w.num_tokens) * g.num_kv_heads * g.head_dim * dtype_size(w.dtype);
    total += align_up(static_cast<size_t>(w.num_tokens) * sizeof(int64_t)) + parts * align_up(kv_bytes);
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
    if (parts == 2) {
      std::memcpy(host + offset, w.v, kv_bytes);
      offset += align_up(kv_bytes);
    }
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
    if (parts == 2) {
      p.v = at<const void>(dev, offset);
      offset += align_up(kv_bytes);
    }
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
  plan_.build(launch, g, backend_.kv_scale(launch.layer), {backend_.num_workers(), launch.share_chunks});
  const int32_t chunk = plan_.chunk_tokens();
  outputs.chunk_tokens = chunk;
  outputs.attention_seconds = outputs.merge_seconds = outputs.transfer_seconds = 0;
  outputs.kv_bytes_read = plan_.read_tokens() * g.token_kv_bytes();
  outputs.kv_bytes_shared = plan_.shared_tokens() * g.token_kv_bytes();
  if (outputs.splits != nullptr) {
    for (int32_t b = 0; b < batch; ++b) outputs.splits[b] = plan_.sequences()[static_cast<size_t>(b)].chunks.count();
  }

  DecodeShape shape;
  shape.batch = batch;
  shape.rows = launch.total_rows();
  shape.num_q_heads = g.num_q_heads;
  shape.block_ids = batch > 0 ? t.block_indptr[batch] : 0;
  shape.items = static_cast<int64_t>(plan_.items().size());
  shape.members = static_cast<int64_t>(plan_.members().size());
  shape.partial_rows = plan_.partial_rows();
  constexpr int64_t kMaxIndex = std::numeric_limits<int32_t>::max();
  if (shape.items > kMaxIndex || shape.partial_rows > kMaxIndex) {
    return InvalidArgument(
        "split_tokens: expected a chunk length giving < 2^31 work items and partial states, received {} "
        "({} items, {} partial states)",
        chunk, shape.items, shape.partial_rows);
  }
  if (batch == 0) return Status::Ok();
  PAGODA_CUDA_RETURN_IF_ERROR(cudaSetDevice(backend_.device()));

  const size_t q_elem = dtype_size(launch.q_dtype);
  shape.q_bytes = static_cast<size_t>(shape.rows) * g.num_q_heads * g.head_dim * q_elem;
  PAGODA_RETURN_IF_ERROR(reserve_decode(shape));
  const InputLayout in(shape);
  const PartialLayout part(shape, g);
  const OutputLayout out(shape, g, q_elem);
  stage_inputs(plan_, launch, shape, in, staging_in_.data());

  void* dev = device_in_.data();
  PAGODA_CUDA_RETURN_IF_ERROR(cudaEventRecord(ev_copy_in_, stream_));
  PAGODA_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(dev, staging_in_.data(), in.total, cudaMemcpyHostToDevice, stream_));

  const LaunchConstants& k = plan_.constants();
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
  p.work.item_chunk = at<const int32_t>(dev, in.item_chunk);
  p.work.item_members = at<const int32_t>(dev, in.item_members);
  p.work.members = at<const int32_t>(dev, in.members);
  p.work.seq_first_chunk = at<const int32_t>(dev, in.seq_first_chunk);
  p.work.seq_chunks = at<const int32_t>(dev, in.seq_chunks);
  p.work.seq_partial = at<const int32_t>(dev, in.seq_partial);
  p.variant.q_indptr = at<const int32_t>(dev, in.q_indptr);
  p.variant.sliding_window = launch.sliding_window;
  p.variant.soft_cap = k.soft_cap;
  p.variant.inv_soft_cap = k.inv_soft_cap;
  p.variant.soft_cap_log2 = k.soft_cap_log2;
  p.q = at<const void>(dev, in.q);
  p.q_dtype = launch.q_dtype;
  p.q_scale = k.q_scale;
  void* ws = partials_.data();
  p.partials = {at<float>(ws, part.acc), at<float>(ws, part.m), at<float>(ws, part.l)};

  MergeParams m;
  m.rows = shape.rows;
  m.num_q_heads = g.num_q_heads;
  m.head_dim = g.v_dim();  // partials and outputs are V's width
  m.q_indptr = p.variant.q_indptr;
  m.row_seq = at<const int32_t>(dev, in.row_seq);
  m.seq_chunks = p.work.seq_chunks;
  m.seq_partial = p.work.seq_partial;
  m.sinks_log2 = k.has_sinks ? at<const float>(dev, in.sinks) : nullptr;
  m.acc = p.partials.acc;
  m.m = p.partials.m;
  m.l = p.partials.l;
  m.out = at<void>(device_out_.data(), out.out);
  m.out_dtype = launch.q_dtype;
  m.lse = at<float>(device_out_.data(), out.lse);
  m.out_scale = k.out_scale;

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
  std::memcpy(outputs.out, staging_out_.data() + out.out, rows * g.v_dim() * q_elem);
  if (outputs.lse != nullptr) std::memcpy(outputs.lse, staging_out_.data() + out.lse, rows * sizeof(float));
  Status status;
  outputs.attention_seconds = elapsed_seconds(ev_partial_, ev_done_, &status);
  outputs.merge_seconds = elapsed_seconds(ev_merge_, ev_done_, &status);
  outputs.transfer_seconds =
      elapsed_seconds(ev_copy_in_, ev_partial_, &status) + elapsed_seconds(ev_done_, ev_copy_out_, &status);
  return status;
}

}  // namespace pagoda::cuda
