#include "rpc/request_decoding.h"

#include <algorithm>
#include <cmath>
#include <optional>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "pagoda/geometry_rules.h"
#include "pagoda/host_convert.h"

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

// The bytes of a tensor that names a shared-memory range instead of carrying
// data: exactly rows * row_bytes of them, inside a region of the caller's.
StatusOr<TensorView> shm_tensor(const char* field, const v1::Tensor& t, uint64_t rows, uint64_t row_bytes,
                                TensorView view, const TensorSources& sources) {
  if (!t.data().empty()) {
    return InvalidArgument("{}: expected data or shm, received both ({} bytes of data and a shm range)", field,
                           t.data().size());
  }
  const std::string at = std::string(field) + ".shm";
  if (sources.shm == nullptr || !sources.shm->enabled()) {
    return Status(StatusCode::kFailedPrecondition,
                  fmt::format("{}: expected a server started with --allow-shared-memory, received a shared-memory "
                              "tensor",
                              at));
  }
  const auto byte_size = static_cast<uint64_t>(t.shm().byte_size());
  if ((row_bytes > 0 && rows > UINT64_MAX / row_bytes) || t.shm().byte_size() < 0 || rows * row_bytes != byte_size) {
    return InvalidArgument("{}.byte_size: expected {} bytes (shape {} of {}), received {}", at,
                           static_cast<double>(rows) * static_cast<double>(row_bytes), shape_text(t.shape()),
                           v1::DType_Name(t.dtype()), t.shm().byte_size());
  }
  StatusOr<SharedMemorySpan> span =
      sources.shm->resolve(sources.tenant, at, t.shm().region(), t.shm().offset(), t.shm().byte_size());
  if (!span.ok()) return span.status();
  view.rows = static_cast<int64_t>(rows);
  view.data = span->data;
  view.region = std::move(span->region);
  return view;
}

// A v sent to a latent-attention server: V is the prefix of k's rows there.
Status latent_v_refusal(const CacheGeometry& g) {
  return InvalidArgument("v: expected no v on a latent-attention server (v_head_dim {} < head_dim {}: V is the "
                         "first {} elements of k's rows), received a v tensor",
                         g.v_dim(), g.head_dim, g.v_dim());
}

}  // namespace

StatusOr<TensorView> check_tensor(const char* field, const v1::Tensor& t, std::initializer_list<int64_t> shape,
                                  const TensorSources& sources) {
  const int wire = t.dtype();
  if (wire == v1::DTYPE_UNSPECIFIED) {
    return InvalidArgument("{}.dtype: expected FLOAT32, FLOAT16 or BFLOAT16, received DTYPE_UNSPECIFIED", field);
  }
  if (wire == v1::FLOAT8_E4M3 || wire == v1::FLOAT8_E5M2) {
    return InvalidArgument("{}.dtype: expected FLOAT32, FLOAT16 or BFLOAT16, received {} (a cache dtype only)", field,
                           v1::DType_Name(t.dtype()));
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
  if (t.has_shm()) return shm_tensor(field, t, rows, row_bytes, view, sources);
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

Status check_finite(const char* field, const TensorView& t, int32_t heads, int32_t head_dim) {
  const int64_t elems = t.rows * heads * head_dim;
  const int64_t bad = first_non_finite(t.data, t.dtype, elems);
  if (bad < 0) return Status::Ok();
  float value = 0;
  convert_to_float(static_cast<const std::byte*>(t.data) + bad * static_cast<int64_t>(dtype_size(t.dtype)), t.dtype,
                   &value, 1);
  const int64_t per_row = static_cast<int64_t>(heads) * head_dim;
  return InvalidArgument("{}[{}]: expected finite values, received {} (row {}, head {}, element {})", field, bad, value,
                         bad / per_row, bad % per_row / head_dim, bad % head_dim);
}

Status decode_request(const v1::DecodeRequest& r, const CacheGeometry& g, int32_t max_batch, DecodeWork& work,
                      const TensorSources& sources) {
  PAGODA_RETURN_IF_ERROR(check_layer(r.layer(), g.num_layers));
  const int batch = r.sequence_ids_size();
  if (batch < 1 || batch > max_batch) {
    return InvalidArgument("sequence_ids: expected 1 to {} ids (--max-batch), received {}", max_batch, batch);
  }
  if (const std::optional<SequenceId> dup = first_duplicate(r.sequence_ids())) {
    return InvalidArgument("sequence_ids: expected each id at most once, received {} more than once", *dup);
  }
  // Query rows: one per sequence, or q_lengths[i] of sequence i.
  int64_t rows = batch;
  if (r.q_lengths_size() > 0) {
    if (r.q_lengths_size() != batch) {
      return InvalidArgument("q_lengths: expected {} values (one per sequence id) or none, received {}", batch,
                             r.q_lengths_size());
    }
    rows = 0;
    for (int i = 0; i < batch; ++i) {
      if (r.q_lengths(i) < 1) {
        return InvalidArgument("q_lengths[{}]: expected >= 1 query tokens, received {}", i, r.q_lengths(i));
      }
      rows += r.q_lengths(i);
    }
  }
  if (r.expected_lengths_size() > 0) {
    if (r.expected_lengths_size() != batch) {
      return InvalidArgument("expected_lengths: expected {} values (one per sequence id) or none, received {}",
                             batch, r.expected_lengths_size());
    }
    for (int i = 0; i < batch; ++i) {
      if (r.expected_lengths(i) < 0) {
        return InvalidArgument("expected_lengths[{}]: expected >= 0, received {}", i, r.expected_lengths(i));
      }
    }
  }
  StatusOr<TensorView> q = check_tensor("q", r.q(), {rows, g.num_q_heads, g.head_dim}, sources);
  PAGODA_RETURN_IF_ERROR(q.status());
  work.k = work.v = nullptr;
  if (g.latent()) {
    if (r.has_v()) return latent_v_refusal(g);
  } else if (r.has_k() != r.has_v()) {
    return r.has_k() ? InvalidArgument("v: expected v together with k, received k without v")
                     : InvalidArgument("k: expected k together with v, received v without k");
  }
  if (r.has_k()) {
    StatusOr<TensorView> k = check_tensor("k", r.k(), {rows, g.num_kv_heads, g.head_dim}, sources);
    PAGODA_RETURN_IF_ERROR(k.status());
    // K and V values are checked by admission, in one pass with the cache's range (kv_values.h).
    work.k = k->data;
    work.kv_dtype = k->dtype;
    work.regions[1] = k->region;
  }
  if (r.has_v()) {
    StatusOr<TensorView> v = check_tensor("v", r.v(), {rows, g.num_kv_heads, g.head_dim}, sources);
    PAGODA_RETURN_IF_ERROR(v.status());
    if (v->dtype != work.kv_dtype) {
      return InvalidArgument("v.dtype: expected the dtype of k ({}), received {}", v1::DType_Name(r.k().dtype()),
                             v1::DType_Name(r.v().dtype()));
    }
    work.v = v->data;
    work.regions[2] = v->region;
  }
  const float scale = r.scale();
  if (!std::isfinite(scale) || scale < 0.f) {
    return InvalidArgument("scale: expected a finite value >= 0 (0 means 1/sqrt(head_dim)), received {}", scale);
  }
  if (r.sliding_window() < 0) {
    return InvalidArgument("sliding_window: expected >= 0 (0: none), received {}", r.sliding_window());
  }
  // The kernels compute s' = (cap*log2(e)) * tanh(s * (1/cap)) in fp32. Past
  // about 2.36e38 cap*log2(e) is inf (outputs off by ~1, LSE inf); past 2^126,
  // s/cap is subnormal for |s| < cap*2^-126 and its rounding moves a logit by
  // more than 2^-24. A cap that large changes no logit anyway (cap*tanh(s/cap)
  // equals s in fp32 for any |s| below ~1e19), so larger ones are refused.
  constexpr float kMaxSoftCap = 0x1p126f;
  const float cap = r.logits_soft_cap();
  if (!std::isfinite(cap) || cap < 0.f || cap > kMaxSoftCap) {
    return InvalidArgument("logits_soft_cap: expected a value in [0, {}] (0: none; at most 2^126, past which fp32 "
                           "cannot compute cap*tanh(s/cap)), received {}",
                           kMaxSoftCap, cap);
  }
  work.sinks = nullptr;
  if (r.has_sinks()) {
    if (r.sinks().dtype() != v1::FLOAT32) {
      return InvalidArgument("sinks.dtype: expected FLOAT32, received {}", v1::DType_Name(r.sinks().dtype()));
    }
    StatusOr<TensorView> sinks = check_tensor("sinks", r.sinks(), {g.num_q_heads});
    PAGODA_RETURN_IF_ERROR(sinks.status());
    PAGODA_RETURN_IF_ERROR(check_finite("sinks", *sinks, 1, 1));
    work.sinks = sinks->data;
  }

  work.layer = r.layer();
  work.ids = std::span<const SequenceId>(r.sequence_ids().data(), static_cast<size_t>(batch));
  work.q_lengths = std::span<const int32_t>(r.q_lengths().data(), static_cast<size_t>(r.q_lengths_size()));
  work.rows = static_cast<int32_t>(rows);
  work.expected_lengths =
      std::span<const int32_t>(r.expected_lengths().data(), static_cast<size_t>(r.expected_lengths_size()));
  work.q = q->data;
  work.q_dtype = q->dtype;
  work.regions[0] = q->region;
  work.scale = scale > 0.f ? scale : 1.f / std::sqrt(static_cast<float>(g.head_dim));
  work.sliding_window = r.sliding_window();
  work.soft_cap = cap;
  return Status::Ok();
}

Status decode_request(const v1::AppendKVRequest& r, const CacheGeometry& g, AppendWork& work,
                      const TensorSources& sources) {
  PAGODA_RETURN_IF_ERROR(check_layer(r.layer(), g.num_layers));
  if (g.latent()) {
    if (r.has_v()) return latent_v_refusal(g);
    if (!r.has_k()) return InvalidArgument("k: expected k (V is its prefix on this server), received none");
  } else if (!r.has_k() || !r.has_v()) {
    return InvalidArgument("{}: expected k and v together, received {}", r.has_k() ? "v" : "k",
                           r.has_k() ? "k without v" : (r.has_v() ? "v without k" : "neither"));
  }
  StatusOr<TensorView> k = check_tensor("k", r.k(), {-1, g.num_kv_heads, g.head_dim}, sources);
  PAGODA_RETURN_IF_ERROR(k.status());
  TensorView v;
  if (!g.latent()) {
    StatusOr<TensorView> checked = check_tensor("v", r.v(), {k->rows, g.num_kv_heads, g.head_dim}, sources);
    PAGODA_RETURN_IF_ERROR(checked.status());
    if (checked->dtype != k->dtype) {
      return InvalidArgument("v.dtype: expected the dtype of k ({}), received {}", v1::DType_Name(r.k().dtype()),
                             v1::DType_Name(r.v().dtype()));
    }
    v = *checked;
  }
  if (k->rows < 1 || k->rows > INT32_MAX) {
    return InvalidArgument("k.shape[0]: expected 1 to {} tokens, received {}", INT32_MAX, k->rows);
  }
  if (r.has_expected_length() && r.expected_length() < 0) {
    return InvalidArgument("expected_length: expected >= 0, received {}", r.expected_length());
  }
  work.expected_length = r.has_expected_length() ? std::optional<int32_t>(r.expected_length()) : std::nullopt;
  work.id = r.sequence_id();
  work.layer = r.layer();
  work.num_tokens = static_cast<int32_t>(k->rows);
  work.k = k->data;
  work.v = v.data;
  work.dtype = k->dtype;
  work.regions = {k->region, v.region};
  return Status::Ok();
}

}  // namespace pagoda
