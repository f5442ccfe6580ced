#include "rpc/decode_response.h"

#include <initializer_list>

namespace pagoda {
namespace {

void set_tensor(v1::Tensor& t, DType dtype, std::initializer_list<int64_t> shape, size_t bytes) {
  t.set_dtype(to_wire(dtype));
  t.clear_shape();
  for (int64_t d : shape) t.add_shape(d);
  t.mutable_data()->resize(bytes);
}

}  // namespace

void prepare_response(const v1::DecodeRequest& request, const CacheGeometry& g, DecodeWork& work,
                      v1::DecodeResponse& response, std::byte* out, std::byte* lse) {
  const auto batch = static_cast<int64_t>(work.ids.size());
  const auto rows = static_cast<int64_t>(work.rows);
  response.set_request_id(request.request_id());
  // Output rows are V's width: v_head_dim (head_dim unless V is K's prefix).
  const size_t out_bytes = static_cast<size_t>(rows) * g.num_q_heads * g.v_dim() * dtype_size(work.q_dtype);
  v1::Tensor& output = *response.mutable_output();
  set_tensor(output, work.q_dtype, {rows, g.num_q_heads, g.v_dim()}, out != nullptr ? 0 : out_bytes);
  if (out != nullptr) *output.mutable_shm() = request.output_shm();
  work.out = out != nullptr ? static_cast<void*>(out) : output.mutable_data()->data();
  work.lse = nullptr;
  if (request.return_lse()) {
    v1::Tensor& t = *response.mutable_lse();
    set_tensor(t, DType::kFloat32, {rows, g.num_q_heads},
               lse != nullptr ? 0 : static_cast<size_t>(rows) * g.num_q_heads * sizeof(float));
    if (lse != nullptr) *t.mutable_shm() = request.lse_shm();
    work.lse = reinterpret_cast<float*>(lse != nullptr ? lse : reinterpret_cast<std::byte*>(t.mutable_data()->data()));
  }
  response.mutable_lengths()->Resize(static_cast<int>(batch), 0);
  response.mutable_splits()->Resize(static_cast<int>(batch), 0);
  work.lengths = response.mutable_lengths()->mutable_data();
  work.splits = response.mutable_splits()->mutable_data();
}

void finish_response(const DecodeWork& work, SplitMode mode, double total_us, v1::DecodeResponse& response) {
  response.set_split_tokens(work.chunk_tokens);
  response.set_deterministic(mode == SplitMode::kDeterministic);
  v1::DecodeTiming& t = *response.mutable_timing();
  t.set_queue_us(work.queue_us);
  t.set_compute_us(work.compute_us);
  t.set_total_us(total_us);
}

}  // namespace pagoda
