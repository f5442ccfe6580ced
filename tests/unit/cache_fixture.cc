#include "unit/cache_fixture.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <span>
#include <stdexcept>
#include <tuple>
#include <utility>

#include "pagoda/cpu_targets.h"
#include "pagoda/fp8.h"
#include "pagoda/host_convert.h"

namespace pagoda::testing {

float round_to(float x, DType dtype) {
  switch (dtype) {
    case DType::kFloat32: return x;
    case DType::kFloat16: return fp16_to_float(float_to_fp16(x));
    case DType::kBFloat16: return bf16_to_float(float_to_bf16(x));
    case DType::kFloat8E4M3:
    case DType::kFloat8E5M2: return fp8_to_float(float_to_fp8(x, dtype).code, dtype);
  }
  return x;
}

Arithmetic arithmetic_of(const std::string& backend, const CacheGeometry& g) {
  return backend == "cpu" && cpu::bf16_unit_serves(g) ? Arithmetic::kBf16Tiles : Arithmetic::kFp32;
}

CacheFixture::Queries as_multiplied(const CacheFixture::Queries& q, Arithmetic arithmetic) {
  CacheFixture::Queries out = q;
  if (arithmetic == Arithmetic::kBf16Tiles) {
    for (float& x : out.values) x = round_to(x, DType::kBFloat16);
  }
  return out;
}

namespace {

// A backend of `kind` on the fixture's geometry, its stream, every block NaN.
std::pair<std::unique_ptr<Backend>, std::unique_ptr<BackendStream>> open_poisoned(const FixtureOptions& options,
                                                                                const std::string& kind) {
  BackendOptions bo;
  bo.kind = kind;
  bo.kv_scales = options.kv_scales;
  bo.geometry = options.geometry;
  bo.cpu_threads = options.threads;
  auto backend = make_backend(bo);
  if (!backend.ok()) throw std::runtime_error(backend.status().message());
  auto stream = backend.value()->open_stream();
  if (!stream.ok()) throw std::runtime_error(stream.status().message());
  std::vector<int32_t> all(static_cast<size_t>(options.geometry.num_blocks));
  for (int32_t b = 0; b < options.geometry.num_blocks; ++b) all[static_cast<size_t>(b)] = b;
  const Status poisoned = stream.value()->poison_blocks(all);
  if (!poisoned.ok()) throw std::runtime_error(poisoned.message());
  return {std::move(backend.value()), std::move(stream.value())};
}

}  // namespace

CacheGeometry bookkeeping_geometry(int32_t blocks) {
  CacheGeometry g;
  g.num_layers = 2;
  g.num_kv_heads = 1;
  g.num_q_heads = 2;
  g.head_dim = 64;
  g.block_size = 4;
  g.dtype = DType::kFloat32;
  g.num_blocks = blocks;
  return g;
}

CacheFixture::CacheFixture(const FixtureOptions& options)
    : geometry_(options.geometry), kv_scales_(options.kv_scales), rng_(options.seed) {
  if (kv_scales_.empty()) kv_scales_.assign(static_cast<size_t>(geometry_.num_layers), KvScale{});
  std::tie(backend_, stream_) = open_poisoned(options, options.backend);
  for (const std::string& kind : options.also) {
    auto [backend, stream] = open_poisoned(options, kind);
    also_backends_.push_back(std::move(backend));
    also_streams_.push_back(std::move(stream));
  }
  cache_ = std::make_unique<CacheManager>(geometry_);
  const double nan = std::numeric_limits<double>::quiet_NaN();
  k_mirror_.assign(geometry_.pool_elements(), nan);
  v_mirror_.assign(geometry_.pool_elements(), nan);
}

Reservation CacheFixture::pin(int32_t layer, const std::vector<SequenceId>& ids) {
  Reservation r;
  cache_->begin(layer, false, r);
  ReserveRequest request;
  request.ids = ids;
  const Status s = cache_->reserve(r, request);
  EXPECT_TRUE(s.ok()) << s.message();
  return r;
}

SequenceId CacheFixture::add_sequence(int32_t layer, int32_t length) {
  const SequenceId id = cache_->create("test");
  append_random(id, layer, length);
  return id;
}

std::vector<SequenceId> CacheFixture::add_sequences(int32_t layer, const std::vector<int32_t>& lengths,
                                                    const Queries* spike) {
  std::vector<SequenceId> ids;
  std::vector<int32_t> left;  // random tokens still to append
  for (int32_t length : lengths) {
    ids.push_back(cache_->create("test"));
    left.push_back(spike != nullptr && length > 0 ? length - 1 : length);
  }
  for (bool more = true; more;) {
    more = false;
    for (size_t b = 0; b < ids.size(); ++b) {
      const int32_t n = std::min(left[b], geometry_.block_size);
      if (n == 0) continue;
      append_random(ids[b], layer, n);
      left[b] -= n;
      more = true;
    }
  }
  for (size_t b = 0; b < ids.size() && spike != nullptr; ++b) {
    if (lengths[b] > 0) append_spike(ids[b], layer, *spike, static_cast<int32_t>(b));
  }
  return ids;
}

void CacheFixture::append_random(SequenceId id, int32_t layer, int32_t n) {
  const size_t elems = static_cast<size_t>(n) * geometry_.num_kv_heads * geometry_.head_dim;
  std::normal_distribution<float> normal(0.f, 1.f);
  std::uniform_real_distribution<float> unit(-1.f, 1.f);  // |v| <= 1: decode_table.h's bounds
  std::vector<float> k(elems), v(elems);
  for (float& x : k) x = normal(rng_);
  for (float& x : v) x = unit(rng_);
  // Latent attention: V is K's prefix, drawn as V is.
  const int32_t dv = geometry_.v_dim(), d = geometry_.head_dim;
  if (geometry_.latent()) {
    for (size_t i = 0; i < elems; ++i) {
      if (static_cast<int32_t>(i % d) < dv) k[i] = unit(rng_);
    }
  }
  append_rows(id, layer, n, k, v);
}

void CacheFixture::append_rows(SequenceId id, int32_t layer, int32_t n, const std::vector<float>& k,
                               const std::vector<float>& v) {
  auto before = cache_->info(id);
  ASSERT_TRUE(before.ok()) << before.status().message();
  const int32_t first = before->layer_lengths[layer];
  const std::vector<int32_t> table = cache_->block_table(id);
  auto len = cache_->append(*stream_, id, layer, n, k.data(), geometry_.latent() ? nullptr : v.data(),
                            DType::kFloat32);
  ASSERT_TRUE(len.ok()) << len.status().message();
  ASSERT_EQ(*len, first + n);
  follow_copies(id, table);
  mirror(id, layer, first, n, k, v);
}

void CacheFixture::follow_copies(SequenceId id, const std::vector<int32_t>& before) {
  const std::vector<int32_t> after = cache_->block_table(id);
  const CacheGeometry& g = geometry_;
  for (size_t i = 0; i < before.size() && i < after.size(); ++i) {
    if (before[i] == after[i]) continue;
    for (auto& stream : also_streams_) {
      const Status s = stream->copy_block(before[i], after[i]);
      EXPECT_TRUE(s.ok()) << "copy_block on a compared backend: " << s.message();
    }
    for (int32_t layer = 0; layer < g.num_layers; ++layer) {
      const int64_t src = g.element_offset(layer, before[i], 0, 0);
      const int64_t dst = g.element_offset(layer, after[i], 0, 0);
      std::copy_n(k_mirror_.begin() + src, g.block_stride(), k_mirror_.begin() + dst);
      std::copy_n(v_mirror_.begin() + src, g.block_stride(), v_mirror_.begin() + dst);
    }
  }
}

void CacheFixture::mirror(SequenceId id, int32_t layer, int32_t first, int32_t n, const std::vector<float>& k,
                          const std::vector<float>& v) {
  const Reservation r = pin(layer, {id});
  const BatchBlockTables tables = r.tables();
  const CacheGeometry& g = geometry_;
  std::vector<int64_t> slots(static_cast<size_t>(n));
  for (int32_t t = 0; t < n; ++t) {
    const int32_t pos = first + t;
    const int32_t block = tables.block_of(0, pos, g.block_size);
    slots[static_cast<size_t>(t)] = flat_slot(block, pos % g.block_size, g.block_size);
    for (int32_t h = 0; h < g.num_kv_heads; ++h) {
      const int64_t dst = g.element_offset(layer, block, h, pos % g.block_size);
      const size_t src = (static_cast<size_t>(t) * g.num_kv_heads + h) * g.head_dim;
      // As the backend stores and reads it: round(x / scale) * scale.
      const KvScale s = kv_scales_[static_cast<size_t>(layer)];
      for (int32_t i = 0; i < g.head_dim; ++i) {
        k_mirror_[dst + i] = static_cast<double>(round_to(k[src + i] / s.k, g.dtype)) * s.k;
        v_mirror_[dst + i] = static_cast<double>(round_to(v[src + i] / s.v, g.dtype)) * s.v;
      }
    }
  }
  KvWrite w;
  w.layer = layer;
  w.num_tokens = n;
  w.slots = slots.data();
  w.k = k.data();
  w.v = g.latent() ? nullptr : v.data();
  w.dtype = DType::kFloat32;
  for (size_t i = 0; i < also_streams_.size(); ++i) {
    const Status s = also_streams_[i]->write_kv(std::span<const KvWrite>(&w, 1));
    EXPECT_TRUE(s.ok()) << also_backends_[i]->name() << " write_kv: " << s.message();
  }
}

CacheFixture::Queries CacheFixture::random_queries(int32_t batch, DType dtype) {
  const size_t elems = static_cast<size_t>(batch) * geometry_.num_q_heads * geometry_.head_dim;
  std::normal_distribution<float> normal(0.f, 1.f);
  Queries q{std::vector<float>(elems), std::vector<uint8_t>(elems * dtype_size(dtype)), dtype};
  for (float& x : q.values) x = round_to(normal(rng_), dtype);
  convert_from_float(q.values.data(), q.bytes.data(), dtype, static_cast<int64_t>(elems));
  return q;
}

void CacheFixture::append_spike(SequenceId id, int32_t layer, const Queries& q, int32_t row) {
  const CacheGeometry& g = geometry_;
  const size_t elems = static_cast<size_t>(g.num_kv_heads) * g.head_dim;
  std::vector<float> k(elems), v(elems);
  std::uniform_real_distribution<float> unit(-1.f, 1.f);
  for (int32_t h = 0; h < g.num_kv_heads; ++h) {
    const size_t q_off = (static_cast<size_t>(row) * g.num_q_heads + static_cast<size_t>(h) * g.group_size()) * g.head_dim;
    for (int32_t i = 0; i < g.head_dim; ++i) {
      // Latent attention: the V prefix of the row stays in [-1, 1]; the rest carries the spike.
      const bool value_part = g.latent() && i < g.v_dim();
      k[static_cast<size_t>(h) * g.head_dim + i] = value_part ? unit(rng_) : 4.f * q.values[q_off + i];
      v[static_cast<size_t>(h) * g.head_dim + i] = unit(rng_);
    }
  }
  append_rows(id, layer, 1, k, v);
}

namespace {

// [batch + 1] prefix sums of q_lengths, empty when there are none.
std::vector<int32_t> q_indptr_of(const std::vector<int32_t>& q_lengths) {
  std::vector<int32_t> indptr;
  if (q_lengths.empty()) return indptr;
  indptr.push_back(0);
  for (int32_t n : q_lengths) indptr.push_back(indptr.back() + n);
  return indptr;
}

}  // namespace

CacheFixture::Decoded CacheFixture::decode_on(size_t backend_index, int32_t layer, const std::vector<SequenceId>& ids,
                                              const Queries& q, float scale, SplitMode mode, int32_t split_tokens,
                                              const Variant& variant) {
  Decoded d;
  const Reservation r = pin(layer, ids);
  const int32_t batch = static_cast<int32_t>(ids.size());
  const std::vector<int32_t> q_indptr = q_indptr_of(variant.q_lengths);
  const int32_t total_rows = q_indptr.empty() ? batch : q_indptr.back();
  const size_t rows = static_cast<size_t>(total_rows) * geometry_.num_q_heads;
  d.out_bytes.resize(rows * geometry_.v_dim() * dtype_size(q.dtype));
  d.lse.resize(rows);
  d.splits.resize(batch);
  DecodeLaunch launch;
  launch.layer = layer;
  launch.tables = r.tables();
  launch.q = q.bytes.data();
  launch.q_dtype = q.dtype;
  launch.scale = scale;
  launch.mode = mode;
  launch.split_tokens = split_tokens;
  launch.q_indptr = q_indptr.empty() ? nullptr : q_indptr.data();
  launch.sliding_window = variant.window;
  launch.soft_cap = variant.soft_cap;
  launch.sinks = variant.sinks.empty() ? nullptr : variant.sinks.data();
  DecodeOutputs out;
  out.out = d.out_bytes.data();
  out.lse = d.lse.data();
  out.splits = d.splits.data();
  const Status s = stream(backend_index).decode(launch, out);
  EXPECT_TRUE(s.ok()) << backend(backend_index).name() << " decode: " << s.message();
  d.chunk_tokens = out.chunk_tokens;
  d.kv_bytes_read = out.kv_bytes_read;
  d.kv_bytes_shared = out.kv_bytes_shared;
  d.out.resize(rows * geometry_.v_dim());
  convert_to_float(d.out_bytes.data(), q.dtype, d.out.data(), static_cast<int64_t>(d.out.size()));
  return d;
}

ReferenceResult CacheFixture::reference(int32_t layer, const std::vector<SequenceId>& ids, const Queries& q,
                                        double scale, const Variant& variant) {
  const Reservation r = pin(layer, ids);
  std::vector<double> qd(q.values.begin(), q.values.end());
  const std::vector<int32_t> q_indptr = q_indptr_of(variant.q_lengths);
  const std::vector<double> sinks(variant.sinks.begin(), variant.sinks.end());
  ReferenceVariant rv;
  rv.q_indptr = q_indptr.empty() ? nullptr : q_indptr.data();
  rv.window = variant.window;
  rv.soft_cap = variant.soft_cap;
  rv.sinks = variant.sinks.empty() ? nullptr : &sinks;
  return naive_decode(geometry_, k_mirror_, v_mirror_, layer, r.tables(), qd, scale, rv);
}

std::vector<double> CacheFixture::value_row(int32_t layer, SequenceId id, int32_t token, int32_t kv_head) {
  const Reservation r = pin(layer, {id});
  const CacheGeometry& g = geometry_;
  const int32_t block = r.tables().block_of(0, token, g.block_size);
  const auto first = v_mirror_.begin() + g.element_offset(layer, block, kv_head, token % g.block_size);
  return std::vector<double>(first, first + g.head_dim);
}

CacheFixture::Queries select_rows(const CacheFixture::Queries& q, const std::vector<int32_t>& rows,
                                  int32_t row_elems) {
  CacheFixture::Queries out{{}, {}, q.dtype};
  const size_t elem = dtype_size(q.dtype);
  for (int32_t r : rows) {
    const size_t first = static_cast<size_t>(r) * static_cast<size_t>(row_elems);
    out.values.insert(out.values.end(), q.values.begin() + first, q.values.begin() + first + row_elems);
    out.bytes.insert(out.bytes.end(), q.bytes.begin() + first * elem, q.bytes.begin() + (first + row_elems) * elem);
  }
  return out;
}

}  // namespace pagoda::testing
