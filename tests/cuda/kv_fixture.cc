#include "cuda/kv_fixture.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>

#include "pagoda/fp8.h"
#include "pagoda/host_convert.h"

namespace pagoda::testing {

float round_to(DType dtype, float x) {
  switch (dtype) {
    case DType::kFloat16: return fp16_to_float(float_to_fp16(x));
    case DType::kBFloat16: return bf16_to_float(float_to_bf16(x));
    case DType::kFloat32: return x;
    case DType::kFloat8E4M3:
    case DType::kFloat8E5M2: return fp8_to_float(float_to_fp8(x, dtype).code, dtype);
  }
  return x;
}

Queries select_rows(const Queries& q, const std::vector<int32_t>& rows, int32_t row_elems) {
  Queries out;
  out.dtype = q.dtype;
  const size_t elem = dtype_size(q.dtype);
  for (int32_t r : rows) {
    const size_t first = static_cast<size_t>(r) * row_elems;
    out.values.insert(out.values.end(), q.values.begin() + first,
                      q.values.begin() + first + row_elems);
    out.bytes.insert(out.bytes.end(), q.bytes.begin() + first * elem,
                     q.bytes.begin() + (first + row_elems) * elem);
  }
  return out;
}

KvFixture::KvFixture(const CacheGeometry& g, const std::vector<std::string>& kinds,
                     uint64_t seed)
    : geometry_(g), rng_(seed) {
  for (const std::string& kind : kinds) {
    BackendOptions o;
    o.kind = kind;
    o.geometry = g;
    o.cpu_threads = 2;
    o.max_batch = 64;
    auto b = make_backend(o);
    if (!b.ok()) {
      status_ = b.status();
      return;
    }
    auto stream = b.value()->open_stream();
    if (!stream.ok()) {
      status_ = stream.status();
      return;
    }
    backends_.push_back(std::move(b.value()));
    streams_.push_back(std::move(stream.value()));
  }
  free_blocks_.resize(g.num_blocks);
  std::iota(free_blocks_.begin(), free_blocks_.end(), 0);
  std::shuffle(free_blocks_.begin(), free_blocks_.end(), rng_);
  for (auto& stream : streams_) {
    const Status s = stream->poison_blocks(free_blocks_);
    if (!s.ok()) {
      status_ = s;
      return;
    }
  }
  const double nan = std::numeric_limits<double>::quiet_NaN();
  k_mirror_.assign(g.pool_elements(), nan);
  v_mirror_.assign(g.pool_elements(), nan);
}

Queries KvFixture::random_queries(int32_t batch, DType dtype) {
  std::uniform_real_distribution<float> u(-1.f, 1.f);
  Queries q;
  q.dtype = dtype;
  const size_t n = static_cast<size_t>(batch) * geometry_.num_q_heads * geometry_.head_dim;
  std::vector<float> values(n);
  for (float& x : values) x = round_to(dtype, u(rng_));
  q.values.assign(values.begin(), values.end());
  q.bytes.resize(n * dtype_size(dtype));
  convert_from_float(values.data(), q.bytes.data(), dtype, static_cast<int64_t>(n));
  return q;
}

void KvFixture::write(int32_t layer, const std::vector<int64_t>& slots,
                      const std::vector<float>& k, const std::vector<float>& v) {
  KvWrite w;
  w.layer = layer;
  w.num_tokens = static_cast<int32_t>(slots.size());
  w.slots = slots.data();
  w.k = k.data();
  w.v = v.data();
  w.dtype = DType::kFloat32;
  for (size_t i = 0; i < backends_.size(); ++i) {
    const Status s = streams_[i]->write_kv(std::span<const KvWrite>(&w, 1));
    EXPECT_TRUE(s.ok()) << backends_[i]->name() << " write_kv: " << s.message();
  }
}

int32_t KvFixture::add_sequence(int32_t layer, int32_t length, const Queries* spike,
                                int32_t spike_row) {
  const CacheGeometry& g = geometry_;
  Sequence seq;
  seq.length = length;
  const int32_t blocks = length / g.block_size + 1;  // always one entry past the need
  if (static_cast<int32_t>(free_blocks_.size()) < blocks) {
    ADD_FAILURE() << "fixture pool too small: " << blocks << " blocks wanted";
    return -1;
  }
  seq.blocks.assign(free_blocks_.end() - blocks, free_blocks_.end());
  free_blocks_.resize(free_blocks_.size() - blocks);

  const int32_t row = g.num_kv_heads * g.head_dim;
  std::uniform_real_distribution<float> u(-1.f, 1.f);
  std::vector<int64_t> slots(length);
  std::vector<float> k(static_cast<size_t>(length) * row);
  std::vector<float> v(k.size());
  for (int32_t t = 0; t < length; ++t) {
    const int32_t block = seq.blocks[t / g.block_size];
    slots[t] = flat_slot(block, t % g.block_size, g.block_size);
    for (int32_t h = 0; h < g.num_kv_heads; ++h) {
      const int64_t at = g.element_offset(layer, block, h, t % g.block_size);
      for (int32_t i = 0; i < g.head_dim; ++i) {
        const size_t src = static_cast<size_t>(t) * row + h * g.head_dim + i;
        float key = u(rng_);
        // Latent attention: the row's V prefix stays in [-1, 1]; its K tail carries the spike.
        if (spike != nullptr && t == length - 1 && (!g.latent() || i >= g.v_dim())) {
          const size_t q_at =
              (static_cast<size_t>(spike_row) * g.num_q_heads + h * g.group_size()) * g.head_dim + i;
          // 64 tail elements need a larger factor than a whole row to hold the row max.
          key = (g.latent() ? 4.f : 0.5f) * static_cast<float>(spike->values[q_at]);
        }
        k[src] = round_to(g.dtype, key);
        v[src] = round_to(g.dtype, u(rng_));
        k_mirror_[at + i] = k[src];
        v_mirror_[at + i] = v[src];
      }
    }
  }
  write(layer, slots, k, v);
  sequences_.push_back(std::move(seq));
  return static_cast<int32_t>(sequences_.size()) - 1;
}

std::vector<double> KvFixture::value_row(int32_t layer, int32_t seq, int32_t token,
                                         int32_t kv_head) const {
  const CacheGeometry& g = geometry_;
  const int32_t block = sequences_[seq].blocks[token / g.block_size];
  const auto first = v_mirror_.begin() + g.element_offset(layer, block, kv_head, token % g.block_size);
  return std::vector<double>(first, first + g.head_dim);
}

BatchBlockTables KvFixture::Tables::view() const {
  BatchBlockTables t;
  t.batch = static_cast<int32_t>(lengths.size());
  t.block_indptr = indptr.data();
  t.block_ids = ids.data();
  t.lengths = lengths.data();
  return t;
}

KvFixture::Tables KvFixture::tables(const std::vector<int32_t>& seqs) const {
  Tables t;
  t.indptr.push_back(0);
  for (int32_t s : seqs) {
    const Sequence& seq = sequences_[s];
    t.ids.insert(t.ids.end(), seq.blocks.begin(), seq.blocks.end());
    t.indptr.push_back(static_cast<int32_t>(t.ids.size()));
    t.lengths.push_back(seq.length);
  }
  return t;
}

Decoded KvFixture::decode(size_t backend, int32_t layer, const std::vector<int32_t>& seqs,
                          const Queries& q, float scale, SplitMode mode, int32_t split_tokens) {
  const CacheGeometry& g = geometry_;
  const Tables t = tables(seqs);
  const size_t rows = seqs.size() * g.num_q_heads;
  DecodeLaunch launch;
  launch.layer = layer;
  launch.tables = t.view();
  launch.q = q.bytes.data();
  launch.q_dtype = q.dtype;
  launch.scale = scale;
  launch.mode = mode;
  launch.split_tokens = split_tokens;
  Decoded d;
  d.out_bytes.assign(rows * g.v_dim() * dtype_size(q.dtype), 0);
  d.lse.assign(rows, 0.f);
  d.splits.assign(seqs.size(), -1);
  DecodeOutputs out;
  out.out = d.out_bytes.data();
  out.lse = d.lse.data();
  out.splits = d.splits.data();
  const Status s = streams_[backend]->decode(launch, out);
  EXPECT_TRUE(s.ok()) << backends_[backend]->name() << " decode: " << s.message();
  d.chunk_tokens = out.chunk_tokens;
  d.out.resize(rows * g.v_dim());
  convert_to_float(d.out_bytes.data(), q.dtype, d.out.data(), static_cast<int64_t>(d.out.size()));
  return d;
}

ReferenceResult KvFixture::reference(int32_t layer, const std::vector<int32_t>& seqs,
                                     const Queries& q, double scale) const {
  const Tables t = tables(seqs);
  return naive_decode(geometry_, k_mirror_, v_mirror_, layer, t.view(), q.values, scale);
}

}  // namespace pagoda::testing
