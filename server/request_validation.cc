#include "request_validation.h"

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>

namespace pagoda {
namespace {

std::string shape_text(std::initializer_list<int64_t> shape) {
  std::vector<std::string> dims;
  for (int64_t d : shape) dims.push_back(d < 0 ? "n" : std::to_string(d));
  return fmt::format("[{}]", fmt::join(dims, ", "));
}

std::string shape_text(const google::protobuf::RepeatedField<int64_t>& shape) {
  return fmt::format("[{}]", fmt::join(shape.begin(), shape.end(), ", "));
}

v1::DType to_wire(DType t) { return static_cast<v1::DType>(static_cast<int>(t)); }

void set_tensor(v1::Tensor& t, DType dtype, std::initializer_list<int64_t> shape, size_t bytes) {
  t.set_dtype(to_wire(dtype));
  t.clear_shape();
  for (int64_t d : shape) t.add_shape(d);
  t.mutable_data()->resize(bytes);
}

}  // namespace

StatusOr<TensorView> check_tensor(const char* field, const v1::Tensor& t, std::initializer_list<int64_t> shape) {
  const int wire = t.dtype();
  if (wire == v1::DTYPE_UNSPECIFIED) {
    return InvalidArgument("{}.dtype: expected FLOAT32, FLOAT16 or BFLOAT16, received DTYPE_UNSPECIFIED", field);
  }
  if (wire != v1::FLOAT32 && wire != v1::FLOAT16 && wire != v1::BFLOAT16) {
    return InvalidArgument("{}.dtype: expected FLOAT32, FLOAT16 or BFLOAT16, received {}", field, wire);
  }
  TensorView view;
  view.dtype = static_cast<DType>(wire);
  if (t.shape_size() != static_cast<int>(shape.size())) {
    return InvalidArgument("{}.shape: expected {}, received {}", field, shape_text(shape), shape_text(t.shape()));
  }
  int64_t row_elements = 1;  // product of every dimension but the first
  int i = 0;
  for (int64_t want : shape) {
    const int64_t got = t.shape(i);
    if ((want >= 0 && got != want) || got < 0) {
      return InvalidArgument("{}.shape: expected {}, received {}", field, shape_text(shape), shape_text(t.shape()));
    }
    if (i > 0) row_elements *= got;
    ++i;
  }
  const auto row_bytes = static_cast<uint64_t>(row_elements) * dtype_size(view.dtype);
  const auto rows = static_cast<uint64_t>(t.shape(0));
  const uint64_t have = t.data().size();
  // rows * row_bytes could overflow for an absurd first dimension: compare by division first.
  if ((row_bytes > 0 && rows > have / row_bytes) || rows * row_bytes != have) {
    return InvalidArgument("{}.data: expected {} bytes (shape {} of {}), received {}", field,
                           static_cast<double>(rows) * static_cast<double>(row_bytes), shape_text(t.shape()),
                           v1::DType_Name(t.dtype()), have);
  }
  view.rows = static_cast<int64_t>(rows);
  view.data = t.data().data();
  return view;
}

Status prepare_decode(const v1::DecodeRequest& r, const CacheGeometry& g, int32_t max_batch, DecodeWork& work,
                      v1::DecodeResponse& response) {
  if (r.layer() < 0 || r.layer() >= g.num_layers) {
    return InvalidArgument("layer: expected [0, {}), received {}", g.num_layers, r.layer());
  }
  const int batch = r.sequence_ids_size();
  if (batch < 1 || batch > max_batch) {
    return InvalidArgument("sequence_ids: expected 1 to {} ids (--max-batch), received {}", max_batch, batch);
  }
  thread_local std::vector<SequenceId> sorted;
  sorted.assign(r.sequence_ids().begin(), r.sequence_ids().end());
  std::sort(sorted.begin(), sorted.end());
  const auto dup = std::adjacent_find(sorted.begin(), sorted.end());
  if (dup != sorted.end()) {
    return InvalidArgument("sequence_ids: expected each id at most once, received {} more than once", *dup);
  }
  const int64_t b = batch;
  StatusOr<TensorView> q = check_tensor("q", r.q(), {b, g.num_q_heads, g.head_dim});
  PAGODA_RETURN_IF_ERROR(q.status());
  if (r.has_k() != r.has_v()) {
    return r.has_k() ? InvalidArgument("v: expected v together with k, received k without v")
                     : InvalidArgument("k: expected k together with v, received v without k");
  }
  work.k = work.v = nullptr;
  if (r.has_k()) {
    StatusOr<TensorView> k = check_tensor("k", r.k(), {b, g.num_kv_heads, g.head_dim});
    PAGODA_RETURN_IF_ERROR(k.status());
    StatusOr<TensorView> v = check_tensor("v", r.v(), {b, g.num_kv_heads, g.head_dim});
    PAGODA_RETURN_IF_ERROR(v.status());
    if (v->dtype != k->dtype) {
      return InvalidArgument("v.dtype: expected the dtype of k ({}), received {}", v1::DType_Name(r.k().dtype()),
                             v1::DType_Name(r.v().dtype()));
    }
    work.k = k->data;
    work.v = v->data;
    work.kv_dtype = k->dtype;
  }
  const float scale = r.scale();
  if (!std::isfinite(scale) || scale < 0.f) {
    return InvalidArgument("scale: expected a finite value >= 0 (0 means 1/sqrt(head_dim)), received {}", scale);
  }

  work.layer = r.layer();
  work.ids = std::span<const SequenceId>(r.sequence_ids().data(), static_cast<size_t>(batch));
  work.q = q->data;
  work.q_dtype = q->dtype;
  work.scale = scale > 0.f ? scale : 1.f / std::sqrt(static_cast<float>(g.head_dim));

  response.set_request_id(r.request_id());
  const size_t out_bytes = static_cast<size_t>(b) * g.num_q_heads * g.head_dim * dtype_size(q->dtype);
  set_tensor(*response.mutable_output(), q->dtype, {b, g.num_q_heads, g.head_dim}, out_bytes);
  work.out = response.mutable_output()->mutable_data()->data();
  work.lse = nullptr;
  if (r.return_lse()) {
    set_tensor(*response.mutable_lse(), DType::kFloat32, {b, g.num_q_heads},
               static_cast<size_t>(b) * g.num_q_heads * sizeof(float));
    work.lse = reinterpret_cast<float*>(response.mutable_lse()->mutable_data()->data());
  }
  response.mutable_lengths()->Resize(batch, 0);
  response.mutable_splits()->Resize(batch, 0);
  work.lengths = response.mutable_lengths()->mutable_data();
  work.splits = response.mutable_splits()->mutable_data();
  return Status::Ok();
}

Status prepare_append(const v1::AppendKVRequest& r, const CacheGeometry& g, AppendWork& work) {
  if (r.layer() < 0 || r.layer() >= g.num_layers) {
    return InvalidArgument("layer: expected [0, {}), received {}", g.num_layers, r.layer());
  }
  if (!r.has_k() || !r.has_v()) {
    return InvalidArgument("{}: expected k and v together, received {}", r.has_k() ? "v" : "k",
                           r.has_k() ? "k without v" : (r.has_v() ? "v without k" : "neither"));
  }
  StatusOr<TensorView> k = check_tensor("k", r.k(), {-1, g.num_kv_heads, g.head_dim});
  PAGODA_RETURN_IF_ERROR(k.status());
  StatusOr<TensorView> v = check_tensor("v", r.v(), {k->rows, g.num_kv_heads, g.head_dim});
  PAGODA_RETURN_IF_ERROR(v.status());
  if (v->dtype != k->dtype) {
    return InvalidArgument("v.dtype: expected the dtype of k ({}), received {}", v1::DType_Name(r.k().dtype()),
                           v1::DType_Name(r.v().dtype()));
  }
  if (k->rows < 1 || k->rows > INT32_MAX) {
    return InvalidArgument("k.shape[0]: expected 1 to {} tokens, received {}", INT32_MAX, k->rows);
  }
  work.id = r.sequence_id();
  work.layer = r.layer();
  work.num_tokens = static_cast<int32_t>(k->rows);
  work.k = k->data;
  work.v = v->data;
  work.dtype = k->dtype;
  return Status::Ok();
}

void finish_decode_response(const DecodeWork& work, SplitMode mode, double total_us, v1::DecodeResponse& response) {
  response.set_split_tokens(work.chunk_tokens);
  response.set_deterministic(mode == SplitMode::kDeterministic);
  v1::DecodeTiming& t = *response.mutable_timing();
  t.set_queue_us(work.queue_us);
  t.set_compute_us(work.compute_us);
  t.set_total_us(total_us);
}

}  // namespace pagoda
