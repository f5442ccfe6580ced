#include "concurrency/fake_backend.h"

#include <cmath>
#include <cstring>
#include <limits>

namespace pagoda::testing {
namespace {

class FakeStream final : public BackendStream {
 public:
  explicit FakeStream(FakeBackend& b) : b_(b) {}

  Status write_kv(std::span<const KvWrite> writes) override {
    for (const KvWrite& w : writes) {
      for (int32_t t = 0; t < w.num_tokens; ++t) {
        const size_t row = static_cast<size_t>(t) * b_.geometry().num_kv_heads * b_.geometry().head_dim;
        b_.markers()[static_cast<size_t>(w.layer)][static_cast<size_t>(w.slots[t])] =
            static_cast<const float*>(w.k)[row];
      }
    }
    return Status::Ok();
  }

  // The marker travels as the first element of each row (fp32 cache assumed).
  Status read_kv(int32_t layer, std::span<const int64_t> slots, void* k, void* v) override {
    const size_t row = static_cast<size_t>(b_.geometry().num_kv_heads) * b_.geometry().head_dim;
    for (size_t t = 0; t < slots.size(); ++t) {
      const auto marker = static_cast<float>(b_.markers()[static_cast<size_t>(layer)][static_cast<size_t>(slots[t])]);
      static_cast<float*>(k)[t * row] = marker;
      static_cast<float*>(v)[t * row] = marker;
    }
    return Status::Ok();
  }

  Status write_kv_raw(int32_t layer, std::span<const int64_t> slots, const void* k, const void*) override {
    const size_t row = static_cast<size_t>(b_.geometry().num_kv_heads) * b_.geometry().head_dim;
    for (size_t t = 0; t < slots.size(); ++t) {
      b_.markers()[static_cast<size_t>(layer)][static_cast<size_t>(slots[t])] = static_cast<const float*>(k)[t * row];
    }
    return Status::Ok();
  }

  Status copy_block(int32_t src, int32_t dst) override {
    const int32_t bs = b_.geometry().block_size;
    for (auto& layer : b_.markers()) {
      std::memcpy(layer.data() + static_cast<size_t>(dst) * bs, layer.data() + static_cast<size_t>(src) * bs,
                  static_cast<size_t>(bs) * sizeof(double));
    }
    return Status::Ok();
  }

  Status poison_blocks(std::span<const int32_t> blocks) override {
    const int32_t bs = b_.geometry().block_size;
    for (auto& layer : b_.markers())
      for (int32_t blk : blocks)
        for (int32_t i = 0; i < bs; ++i) layer[static_cast<size_t>(blk) * bs + i] = std::numeric_limits<double>::quiet_NaN();
    return Status::Ok();
  }

  Status decode(const DecodeLaunch& launch, DecodeOutputs& out) override {
    const CacheGeometry& g = b_.geometry();
    const BatchBlockTables& t = launch.tables;
    const auto& layer = b_.markers()[static_cast<size_t>(launch.layer)];
    for (int32_t b = 0; b < t.batch; ++b) {
      double sum = 0;
      for (int32_t pos = 0; pos < t.lengths[b]; ++pos) {
        sum += layer[static_cast<size_t>(t.block_of(b, pos, g.block_size)) * g.block_size + pos % g.block_size];
      }
      for (int32_t r = launch.first_row(b); r < launch.first_row(b) + launch.rows_of(b); ++r) {
        for (int32_t h = 0; h < g.num_q_heads; ++h) {
          float* o = static_cast<float*>(out.out) + (static_cast<size_t>(r) * g.num_q_heads + h) * g.head_dim;
          std::memset(o, 0, static_cast<size_t>(g.head_dim) * sizeof(float));
          o[0] = static_cast<float>(sum);
          if (out.lse) out.lse[static_cast<size_t>(r) * g.num_q_heads + h] = static_cast<float>(t.lengths[b]);
        }
      }
      if (out.splits) out.splits[b] = 1;
    }
    out.chunk_tokens = launch.split_tokens;
    return Status::Ok();
  }

  StatusOr<double> measure_memory_bandwidth(int64_t) override { return 1.0; }

 private:
  FakeBackend& b_;
};

}  // namespace

FakeBackend::FakeBackend(const CacheGeometry& g)
    : geometry_(g),
      markers_(static_cast<size_t>(g.num_layers),
               std::vector<double>(static_cast<size_t>(g.num_blocks) * g.block_size,
                                   std::numeric_limits<double>::quiet_NaN())) {}

StatusOr<std::unique_ptr<BackendStream>> FakeBackend::open_stream() {
  return std::unique_ptr<BackendStream>(new FakeStream(*this));
}

}  // namespace pagoda::testing
