#include "shm_tensors.h"

#include <utility>

#include "pagoda/host_convert.h"

namespace pagoda::bench {
namespace {

// Offsets are rounded up to 64 bytes: every range is then aligned for its
// elements (the output and LSE must be) and no two share a cache line.
int64_t aligned(int64_t bytes) { return (bytes + 63) / 64 * 64; }

}  // namespace

client::Result<ShmTensors> ShmTensors::place(client::Client& c, const std::string& name, std::span<const float> q,
                                             std::span<const float> k, std::span<const float> v, int64_t out_elems,
                                             DType dtype) {
  const auto esize = static_cast<int64_t>(dtype_size(dtype));
  const int64_t q_bytes = static_cast<int64_t>(q.size()) * esize;
  const int64_t kv_bytes = static_cast<int64_t>(k.size()) * esize;
  const int64_t out_bytes = out_elems * esize;
  const int64_t total = aligned(q_bytes) + 2 * aligned(kv_bytes) + aligned(out_bytes);
  auto region = client::SharedMemoryRegion::create("/" + name, static_cast<size_t>(total));
  if (!region.ok()) return region.error();
  ShmTensors t(c, std::move(*region));
  int64_t at = 0;
  auto put = [&](client::ShmRef& ref, std::span<const float> values, int64_t bytes) {
    ref = {name, at, bytes};
    if (!values.empty()) convert_from_float(values.data(), t.region_.data() + at, dtype, static_cast<int64_t>(values.size()));
    at += aligned(bytes);
  };
  put(t.q_, q, q_bytes);
  put(t.k_, k, kv_bytes);
  put(t.v_, v, kv_bytes);
  put(t.out_, {}, out_bytes);
  auto registered = c.register_shared_memory(name, t.region_.key(), 0, total);
  if (!registered.ok()) {
    t.client_ = nullptr;  // nothing to unregister; the server's message names --allow-shared-memory
    return registered.error();
  }
  return t;
}

ShmTensors::ShmTensors(ShmTensors&& other) noexcept
    : client_(std::exchange(other.client_, nullptr)),
      region_(std::move(other.region_)),
      q_(std::move(other.q_)),
      k_(std::move(other.k_)),
      v_(std::move(other.v_)),
      out_(std::move(other.out_)) {}

ShmTensors::~ShmTensors() {
  if (client_ != nullptr) (void)client_->unregister_shared_memory(q_.region);
}

void ShmTensors::name_in(client::DecodeArgs& args) const {
  args.q = {};
  args.q_shm = q_;
  if (k_.byte_size > 0) {
    args.k = args.v = {};
    args.k_shm = k_;
    args.v_shm = v_;
  }
  args.output_shm = out_;
}

}  // namespace pagoda::bench
