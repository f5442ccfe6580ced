#include "rpc/request_decoding.h"

#include <algorithm>
#include <cmath>
#include <optional>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "pagoda/geometry_rules.h"

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

// The first id that appears twice, or none. Small batches compare pairs; larger
// ones sort a copy.
std::optional<SequenceId> first_duplicate(const google::protobuf::RepeatedField<uint64_t>& ids) {
  if (ids.size() <= 32) {
    for (int i = 0; i < ids.size(); ++i)
      for (int j = 0; j < i; ++j)
        if (ids[i] == ids[j]) return ids[i];
    return std::nullopt;
  }
  std::vector<SequenceId> sorted(ids.begin(), ids.end());
  std::sort(sorted.begin(), sorted.end());
  const auto dup = std::adjacent_find(sorted.begin(), sorted.end());
  if (dup == sorted.end()) return std::nullopt;
  return *dup;
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

Status decode_request(const v1::DecodeRequest& r, const CacheGeometry& g, int32_t max_batch, DecodeWork& work) {
  PAGODA_RETURN_IF_ERROR(check_layer(r.layer(), g.num_layers));
  const int batch = r.sequence_ids_size();
  if (batch < 1 || batch > max_batch) {
    return InvalidArgument("sequence_ids: expected 1 to {} ids (--max-batch), received {}", max_batch, batch);
  }
  if (const std::optional<SequenceId> dup = first_duplicate(r.sequence_ids())) {
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
  return Status::Ok();
}

Status decode_request(const v1::AppendKVRequest& r, const CacheGeometry& g, AppendWork& work) {
  PAGODA_RETURN_IF_ERROR(check_layer(r.layer(), g.num_layers));
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

}  // namespace pagoda
