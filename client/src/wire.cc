#include "wire.h"

#include <cmath>

#include <fmt/format.h>

#include "pagoda/client/tensor.h"

namespace pagoda::client::wire {
namespace {

Error size_mismatch(std::string_view field, int64_t want, size_t got, std::string_view shape) {
  return invalid_argument(
      fmt::format("{}: expected {} values ({}), received {}", field, want, shape, got));
}

}  // namespace

ServerConfig config_from_proto(const v1::GetConfigResponse& m) {
  ServerConfig c;
  c.num_layers = m.num_layers();
  c.num_q_heads = m.num_q_heads();
  c.num_kv_heads = m.num_kv_heads();
  c.head_dim = m.head_dim();
  c.v_head_dim = m.v_head_dim() > 0 ? m.v_head_dim() : m.head_dim();  // 0: a server older than the field
  c.block_size = m.block_size();
  // Any cache dtype, fp8 included (an unknown one would be a server bug:
  // reported as fp32 rather than failing).
  const auto cache = static_cast<DType>(m.cache_dtype());
  c.cache_dtype = known_dtype(cache) ? cache : DType::kFloat32;
  c.total_blocks = m.total_blocks();
  c.free_blocks = m.free_blocks();
  c.tenant = m.tenant();
  c.tenant_max_blocks = m.tenant_max_blocks();
  c.tenant_max_sequences = m.tenant_max_sequences();
  c.tenant_blocks = m.tenant_blocks();
  c.tenant_sequences = m.tenant_sequences();
  c.tls = m.tls();
  c.auth = m.auth();
  c.split_tokens = m.split_tokens();
  c.deterministic = m.deterministic();
  c.backend = m.backend();
  c.device_name = m.device_name();
  c.version = m.version();
  c.max_message_bytes = m.max_message_bytes();
  c.max_batch = m.max_batch();
  c.max_batch_wait_us = m.max_batch_wait_us();
  c.k_scales.assign(m.k_scales().begin(), m.k_scales().end());
  c.v_scales.assign(m.v_scales().begin(), m.v_scales().end());
  return c;
}

void fill_tensor(v1::Tensor& t, std::span<const float> values, DType dtype,
                 std::initializer_list<int64_t> shape) {
  t.set_dtype(static_cast<v1::DType>(wire_dtype(dtype)));
  t.clear_shape();
  for (int64_t d : shape) t.add_shape(d);
  t.set_data(encode_values(values, dtype));
}

namespace {

void set_ref(v1::SharedMemoryRef& m, const ShmRef& r) {
  m.set_region(r.region);
  m.set_offset(r.offset);
  m.set_byte_size(r.byte_size);
}

// A tensor whose bytes lie in a registered region.
void shm_tensor(v1::Tensor& t, const ShmRef& ref, DType dtype, std::initializer_list<int64_t> shape) {
  t.set_dtype(static_cast<v1::DType>(wire_dtype(dtype)));
  t.clear_shape();
  for (int64_t d : shape) t.add_shape(d);
  set_ref(*t.mutable_shm(), ref);
}

}  // namespace

Result<v1::DecodeRequest> decode_request(const DecodeArgs& args, const ServerConfig& config) {
  const auto batch = static_cast<int64_t>(args.sequence_ids.size());
  if (batch == 0) return invalid_argument("sequence_ids: expected at least 1 id, received 0");
  if (!args.q_lengths.empty() && static_cast<int64_t>(args.q_lengths.size()) != batch) {
    return invalid_argument(fmt::format("q_lengths: expected {} entries (one per sequence) or none, received {}",
                                        batch, args.q_lengths.size()));
  }
  for (size_t i = 0; i < args.q_lengths.size(); ++i) {
    if (args.q_lengths[i] < 1) {
      return invalid_argument(fmt::format("q_lengths[{}]: expected >= 1, received {}", i, args.q_lengths[i]));
    }
  }
  if (!args.expected_lengths.empty() && static_cast<int64_t>(args.expected_lengths.size()) != batch) {
    return invalid_argument(fmt::format(
        "expected_lengths: expected {} entries (one per sequence) or none, received {}", batch,
        args.expected_lengths.size()));
  }
  if (!args.sinks.empty() && static_cast<int64_t>(args.sinks.size()) != config.num_q_heads) {
    return invalid_argument(fmt::format("sinks: expected {} values (one per query head) or none, received {}",
                                        config.num_q_heads, args.sinks.size()));
  }
  const int64_t rows = args.rows();
  if (!args.q_shm && static_cast<int64_t>(args.q.size()) != rows * config.q_row()) {
    return size_mismatch("q", rows * config.q_row(), args.q.size(),
                         fmt::format("[{}, {}, {}]", rows, config.num_q_heads, config.head_dim));
  }
  if (config.latent()) {
    // V is the prefix of k's rows there: a v has no place.
    if (args.v_shm.has_value() || !args.v.empty()) {
      return invalid_argument(fmt::format("v: expected none on a latent-attention server (v_head_dim {} < head_dim "
                                          "{}: V is the first {} elements of k's rows), received a v",
                                          config.v_head_dim, config.head_dim, config.v_head_dim));
    }
  } else if (args.k_shm.has_value() != args.v_shm.has_value()) {
    return invalid_argument("k_shm, v_shm: expected both or neither");
  } else if (args.k.empty() != args.v.empty()) {
    return invalid_argument(fmt::format("k, v: expected both or neither, received k with {} values "
                                        "and v with {}", args.k.size(), args.v.size()));
  }
  const std::string kv_shape =
      fmt::format("[{}, {}, {}]", rows, config.num_kv_heads, config.head_dim);
  if (!args.k.empty() && static_cast<int64_t>(args.k.size()) != rows * config.kv_row())
    return size_mismatch("k", rows * config.kv_row(), args.k.size(), kv_shape);
  if (!args.v.empty() && static_cast<int64_t>(args.v.size()) != rows * config.kv_row())
    return size_mismatch("v", rows * config.kv_row(), args.v.size(), kv_shape);

  v1::DecodeRequest req;
  req.set_layer(args.layer);
  req.mutable_sequence_ids()->Add(args.sequence_ids.begin(), args.sequence_ids.end());
  const std::initializer_list<int64_t> q_shape = {rows, config.num_q_heads, config.head_dim};
  const std::initializer_list<int64_t> kv_shape_dims = {rows, config.num_kv_heads, config.head_dim};
  if (args.q_shm) {
    shm_tensor(*req.mutable_q(), *args.q_shm, args.q_dtype, q_shape);
  } else {
    fill_tensor(*req.mutable_q(), args.q, args.q_dtype, q_shape);
  }
  if (args.k_shm) {
    shm_tensor(*req.mutable_k(), *args.k_shm, args.kv_dtype, kv_shape_dims);
    if (args.v_shm) shm_tensor(*req.mutable_v(), *args.v_shm, args.kv_dtype, kv_shape_dims);
  } else if (!args.k.empty()) {
    fill_tensor(*req.mutable_k(), args.k, args.kv_dtype, kv_shape_dims);
    if (!args.v.empty()) fill_tensor(*req.mutable_v(), args.v, args.kv_dtype, kv_shape_dims);
  }
  if (args.output_shm) set_ref(*req.mutable_output_shm(), *args.output_shm);
  if (args.lse_shm) set_ref(*req.mutable_lse_shm(), *args.lse_shm);
  req.set_scale(args.scale);
  req.set_return_lse(args.return_lse);
  req.set_request_id(args.request_id);
  req.mutable_q_lengths()->Add(args.q_lengths.begin(), args.q_lengths.end());
  req.set_sliding_window(args.sliding_window);
  req.set_logits_soft_cap(args.logits_soft_cap);
  if (!args.sinks.empty()) {
    v1::Tensor& sinks = *req.mutable_sinks();
    sinks.set_dtype(static_cast<v1::DType>(wire_dtype(DType::kFloat32)));
    sinks.add_shape(config.num_q_heads);
    sinks.set_data(encode_values(args.sinks, DType::kFloat32));
  }
  req.mutable_expected_lengths()->Add(args.expected_lengths.begin(), args.expected_lengths.end());
  return req;
}

Result<DecodeResult> decode_result(const v1::DecodeResponse& m, const ServerConfig& config,
                                   int64_t rows) {
  DecodeResult r;
  r.request_id = m.request_id();
  const auto out_dtype = dtype_from_wire(m.output().dtype(), "output");
  if (!out_dtype.ok()) return out_dtype.error();
  const int64_t out_count = rows * config.out_row();
  if (!m.output().has_shm()) {  // else the server wrote it into the caller's region
    auto output = decode_values(m.output().data(), *out_dtype, out_count, "output");
    if (!output.ok()) return output.error();
    r.output = std::move(*output);
  }
  if (m.has_lse() && !m.lse().data().empty()) {
    auto lse = decode_values(m.lse().data(), DType::kFloat32,
                             rows * config.num_q_heads, "lse");
    if (!lse.ok()) return lse.error();
    r.lse = std::move(*lse);
  }
  r.lengths.assign(m.lengths().begin(), m.lengths().end());
  r.splits.assign(m.splits().begin(), m.splits().end());
  r.split_tokens = m.split_tokens();
  r.deterministic = m.deterministic();
  r.timing = {m.timing().queue_us(), m.timing().compute_us(), m.timing().total_us()};
  return r;
}

}  // namespace pagoda::client::wire
