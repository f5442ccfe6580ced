// Append, block copy and poison on the device, checked byte by byte against the
// host's own conversion (round to nearest even) and the layout's offsets.
#include <gtest/gtest.h>

#include <cstring>
#include <ostream>
#include <random>
#include <string>
#include <vector>

#include "pagoda/fp8.h"
#include "pagoda/host_convert.h"
#include "cuda/cuda_device_backend.h"
#include "cuda/skip_without_device.h"

namespace pagoda::testing {
namespace {

CacheGeometry geometry(DType cache) {
  CacheGeometry g;
  g.num_layers = 2;
  g.num_kv_heads = 2;
  g.num_q_heads = 4;
  g.head_dim = 64;
  g.block_size = 3;
  g.num_blocks = 8;
  g.dtype = cache;
  return g;
}

struct Pools {
  std::vector<unsigned char> k;
  std::vector<unsigned char> v;
};

// A CUDA backend whose every block is NaN, with one stream.
struct Device {
  std::unique_ptr<Backend> backend;
  std::unique_ptr<BackendStream> stream;
  explicit operator bool() const { return stream != nullptr; }
  BackendStream* operator->() { return stream.get(); }
};

Pools read(Device& d) {
  Pools p;
  auto* cuda = dynamic_cast<cuda::CudaStream*>(d.stream.get());
  EXPECT_NE(cuda, nullptr);
  if (cuda == nullptr) return p;
  const Status s = cuda->read_pools(&p.k, &p.v);
  EXPECT_TRUE(s.ok()) << s.message();
  return p;
}

bool all_ones(const unsigned char* bytes, size_t n) {
  for (size_t i = 0; i < n; ++i) {
    if (bytes[i] != 0xFF) return false;
  }
  return true;
}

Device poisoned_backend(const CacheGeometry& g) {
  BackendOptions o;
  o.kind = "cuda";
  o.geometry = g;
  o.max_batch = 4;
  auto b = make_backend(o);
  EXPECT_TRUE(b.ok()) << b.status().message();
  if (!b.ok()) return {};
  auto stream = b.value()->open_stream();
  EXPECT_TRUE(stream.ok()) << stream.status().message();
  if (!stream.ok()) return {};
  std::vector<int32_t> all(g.num_blocks);
  for (int32_t i = 0; i < g.num_blocks; ++i) all[i] = i;
  EXPECT_TRUE(stream.value()->poison_blocks(all).ok());
  return {std::move(b.value()), std::move(stream.value())};
}

Status write_one(Device& d, const KvWrite& w) { return d->write_kv(std::span<const KvWrite>(&w, 1)); }

struct DtypePair {
  DType cache;
  DType input;
};

std::string to_string(const DtypePair& p) {
  return "kv" + std::string(dtype_name(p.cache)) + "_in" + std::string(dtype_name(p.input));
}

// GoogleTest prints a failing case's parameters with this.
void PrintTo(const DtypePair& p, std::ostream* os) { *os << to_string(p); }

class CudaAppend : public ::testing::TestWithParam<DtypePair> {};

TEST_P(CudaAppend, WritesConvertedRowsIntoTheirSlotsAndNothingElse) {
  PAGODA_SKIP_WITHOUT_CUDA_DEVICE();
  const CacheGeometry g = geometry(GetParam().cache);
  const DType in = GetParam().input;
  Device backend = poisoned_backend(g);
  ASSERT_TRUE(backend);

  // Five tokens into scattered slots of layer 1, random full-mantissa values.
  const std::vector<int64_t> slots = {0, 4, 5, 13, 23};
  const int32_t row = g.num_kv_heads * g.head_dim;
  const size_t n = slots.size() * row;
  std::mt19937 rng(5);
  std::uniform_real_distribution<float> u(-3.f, 3.f);
  std::vector<float> k32(n), v32(n);
  for (size_t i = 0; i < n; ++i) {
    k32[i] = u(rng);
    v32[i] = u(rng);
  }
  std::vector<unsigned char> k_in(n * dtype_size(in)), v_in(n * dtype_size(in));
  convert_from_float(k32.data(), k_in.data(), in, static_cast<int64_t>(n));
  convert_from_float(v32.data(), v_in.data(), in, static_cast<int64_t>(n));
  KvWrite w;
  w.layer = 1;
  w.num_tokens = static_cast<int32_t>(slots.size());
  w.slots = slots.data();
  w.k = k_in.data();
  w.v = v_in.data();
  w.dtype = in;
  const Status s = write_one(backend, w);
  ASSERT_TRUE(s.ok()) << s.message();

  // Expected bytes: the host's conversion input -> cache dtype.
  const size_t elem = dtype_size(g.dtype);
  std::vector<unsigned char> k_want(n * elem), v_want(n * elem);
  convert(k_in.data(), in, k_want.data(), g.dtype, static_cast<int64_t>(n));
  convert(v_in.data(), in, v_want.data(), g.dtype, static_cast<int64_t>(n));

  const Pools got = read(backend);
  ASSERT_EQ(got.k.size(), static_cast<size_t>(g.pool_elements()) * elem);
  std::vector<bool> written(g.pool_elements(), false);
  for (size_t t = 0; t < slots.size(); ++t) {
    const int32_t block = static_cast<int32_t>(slots[t] / g.block_size);
    const int32_t offset = static_cast<int32_t>(slots[t] % g.block_size);
    for (int32_t h = 0; h < g.num_kv_heads; ++h) {
      const int64_t at = g.element_offset(1, block, h, offset);
      const size_t src = (t * row + h * g.head_dim) * elem;
      EXPECT_EQ(0, std::memcmp(got.k.data() + at * elem, k_want.data() + src, g.head_dim * elem))
          << "k of token " << t << " head " << h;
      EXPECT_EQ(0, std::memcmp(got.v.data() + at * elem, v_want.data() + src, g.head_dim * elem))
          << "v of token " << t << " head " << h;
      for (int32_t i = 0; i < g.head_dim; ++i) written[at + i] = true;
    }
  }
  for (int64_t i = 0; i < g.pool_elements(); ++i) {
    if (written[i]) continue;
    ASSERT_TRUE(all_ones(got.k.data() + i * elem, elem)) << "k element " << i << " was touched";
    ASSERT_TRUE(all_ones(got.v.data() + i * elem, elem)) << "v element " << i << " was touched";
  }
}

INSTANTIATE_TEST_SUITE_P(
    CacheAndInputDtypes, CudaAppend,
    ::testing::Values(DtypePair{DType::kFloat16, DType::kFloat32},
                      DtypePair{DType::kFloat16, DType::kBFloat16},
                      DtypePair{DType::kFloat16, DType::kFloat16},
                      DtypePair{DType::kBFloat16, DType::kFloat32},
                      DtypePair{DType::kBFloat16, DType::kFloat16},
                      DtypePair{DType::kBFloat16, DType::kBFloat16},
                      DtypePair{DType::kFloat32, DType::kFloat32},
                      DtypePair{DType::kFloat32, DType::kFloat16},
                      DtypePair{DType::kFloat32, DType::kBFloat16},
                      DtypePair{DType::kFloat8E4M3, DType::kFloat32},
                      DtypePair{DType::kFloat8E4M3, DType::kBFloat16},
                      DtypePair{DType::kFloat8E5M2, DType::kFloat32},
                      DtypePair{DType::kFloat8E5M2, DType::kFloat16}),
    [](const ::testing::TestParamInfo<DtypePair>& info) { return to_string(info.param); });

// fp8 with the layer's scales: stored = round(x / scale), saturating; the
// bytes are the host codec's (pagoda/fp8.h) and the saturations are counted.
TEST(CudaAppendFp8, ScalesDivideAndSaturationsAreCounted) {
  PAGODA_SKIP_WITHOUT_CUDA_DEVICE();
  for (DType t : {DType::kFloat8E4M3, DType::kFloat8E5M2}) {
    SCOPED_TRACE(dtype_name(t));
    const CacheGeometry g = geometry(t);
    BackendOptions o;
    o.kind = "cuda";
    o.geometry = g;
    o.max_batch = 4;
    o.kv_scales = {KvScale{1.f, 1.f}, KvScale{0.5f, 4.f}};
    auto b = make_backend(o);
    ASSERT_TRUE(b.ok()) << b.status().message();
    auto stream = b.value()->open_stream();
    ASSERT_TRUE(stream.ok());
    Device d{std::move(b.value()), std::move(stream.value())};
    const int32_t row = g.num_kv_heads * g.head_dim;
    const float max = fp8_spec(t).max_value;
    std::vector<float> k(static_cast<size_t>(row)), v(static_cast<size_t>(row));
    for (int32_t i = 0; i < row; ++i) {
      k[static_cast<size_t>(i)] = (i % 7 == 0 ? 1.5f * max : 0.37f * (i - 60)) * 0.5f;  // 19 saturate
      v[static_cast<size_t>(i)] = (i % 11 == 0 ? -3.f * max : 0.11f * i) * 4.f;          // 12 saturate
    }
    const int64_t slots[] = {7};
    int64_t saturated = 0;
    KvWrite w{1, 1, slots, k.data(), v.data(), DType::kFloat32, &saturated};
    ASSERT_TRUE(write_one(d, w).ok());
    int64_t want_saturated = 0;
    const Pools got = read(d);
    for (int32_t h = 0; h < g.num_kv_heads; ++h) {
      const int64_t at = g.element_offset(1, 7 / g.block_size, h, 7 % g.block_size);
      for (int32_t i = 0; i < g.head_dim; ++i) {
        const size_t src = static_cast<size_t>(h * g.head_dim + i);
        const Fp8Encoded ke = float_to_fp8(k[src] / 0.5f, t);
        const Fp8Encoded ve = float_to_fp8(v[src] / 4.f, t);
        want_saturated += ke.saturated + ve.saturated;
        EXPECT_EQ(got.k[static_cast<size_t>(at + i)], ke.code) << "k " << src;
        EXPECT_EQ(got.v[static_cast<size_t>(at + i)], ve.code) << "v " << src;
      }
    }
    EXPECT_EQ(want_saturated, 31);
    EXPECT_EQ(saturated, want_saturated);
  }
}

TEST(CudaBlocks, CopyBlockCopiesEveryLayerAndPoisonRestoresNaN) {
  PAGODA_SKIP_WITHOUT_CUDA_DEVICE();
  const CacheGeometry g = geometry(DType::kBFloat16);
  Device backend = poisoned_backend(g);
  ASSERT_TRUE(backend);
  const int32_t row = g.num_kv_heads * g.head_dim;
  std::vector<float> rows(static_cast<size_t>(g.block_size) * row);
  for (size_t i = 0; i < rows.size(); ++i) rows[i] = static_cast<float>(i % 97) * 0.25f;
  const std::vector<int64_t> slots = {6, 7, 8};  // block 2, every slot
  for (int32_t layer = 0; layer < g.num_layers; ++layer) {
    KvWrite w;
    w.layer = layer;
    w.num_tokens = g.block_size;
    w.slots = slots.data();
    w.k = rows.data();
    w.v = rows.data();
    ASSERT_TRUE(write_one(backend, w).ok());
  }
  ASSERT_TRUE(backend->copy_block(2, 5).ok());
  const size_t elem = dtype_size(g.dtype);
  const size_t block_bytes = static_cast<size_t>(g.block_stride()) * elem;
  Pools p = read(backend);
  for (int32_t layer = 0; layer < g.num_layers; ++layer) {
    const size_t src = g.element_offset(layer, 2, 0, 0) * elem;
    const size_t dst = g.element_offset(layer, 5, 0, 0) * elem;
    EXPECT_EQ(0, std::memcmp(p.k.data() + src, p.k.data() + dst, block_bytes)) << "layer " << layer;
    EXPECT_EQ(0, std::memcmp(p.v.data() + src, p.v.data() + dst, block_bytes)) << "layer " << layer;
    EXPECT_FALSE(all_ones(p.k.data() + dst, block_bytes));
    EXPECT_TRUE(all_ones(p.k.data() + g.element_offset(layer, 4, 0, 0) * elem, block_bytes));
  }
  const int32_t five[] = {5};
  ASSERT_TRUE(backend->poison_blocks(five).ok());
  p = read(backend);
  for (int32_t layer = 0; layer < g.num_layers; ++layer) {
    EXPECT_TRUE(all_ones(p.k.data() + g.element_offset(layer, 5, 0, 0) * elem, block_bytes));
    EXPECT_TRUE(all_ones(p.v.data() + g.element_offset(layer, 5, 0, 0) * elem, block_bytes));
    EXPECT_FALSE(all_ones(p.k.data() + g.element_offset(layer, 2, 0, 0) * elem, block_bytes));
  }
}

// The bandwidth baseline times a real copy: it checks what the copy wrote
// (INTERNAL otherwise) and reports a figure an HBM can give.
TEST(CudaBlocks, CopyBandwidthBaselineCopiesAndIsPlausible) {
  PAGODA_SKIP_WITHOUT_CUDA_DEVICE();
  Device backend = poisoned_backend(geometry(DType::kFloat16));
  ASSERT_TRUE(backend);
  auto bw = backend->measure_memory_bandwidth(64 << 20);
  ASSERT_TRUE(bw.ok()) << bw.status().message();
  EXPECT_GT(bw.value(), 1e10);  // any datacenter GPU copies > 10 GB/s
  EXPECT_LT(bw.value(), 2e13);  // and < 20 TB/s: more means the timing is broken
  EXPECT_EQ(backend->measure_memory_bandwidth(0).status().code(), StatusCode::kInvalidArgument);
}

// Stored bytes in and out unchanged (an import, an export): each row lands at
// the layout's offset, nothing else is touched, and read_kv gives back the same
// bytes, over runs of slots that cross blocks.
TEST(CudaRawRows, WriteAndReadStoredBytesUnchanged) {
  PAGODA_SKIP_WITHOUT_CUDA_DEVICE();
  for (DType cache : {DType::kFloat16, DType::kFloat32, DType::kFloat8E4M3}) {
    const CacheGeometry g = geometry(cache);
    Device backend = poisoned_backend(g);
    ASSERT_TRUE(backend);
    const std::vector<int64_t> slots = {0, 4, 5, 6, 13, 23};
    const size_t row = static_cast<size_t>(g.head_dim) * dtype_size(cache);
    const size_t bytes = slots.size() * static_cast<size_t>(g.num_kv_heads) * row;
    std::mt19937 rng(9);
    std::vector<unsigned char> k(bytes), v(bytes);
    for (size_t i = 0; i < bytes; ++i) {
      k[i] = static_cast<unsigned char>(rng() & 0x7E);  // never 0xFF: the poison stays tellable
      v[i] = static_cast<unsigned char>(rng() & 0x7E);
    }
    ASSERT_TRUE(backend->write_kv_raw(1, slots, k.data(), v.data()).ok());
    const Pools p = read(backend);
    std::vector<bool> written(p.k.size(), false);
    for (size_t t = 0; t < slots.size(); ++t) {
      const auto block = static_cast<int32_t>(slots[t] / g.block_size);
      const auto slot = static_cast<int32_t>(slots[t] % g.block_size);
      for (int32_t h = 0; h < g.num_kv_heads; ++h) {
        const size_t at = static_cast<size_t>(g.element_offset(1, block, h, slot)) * dtype_size(cache);
        const size_t from = (t * static_cast<size_t>(g.num_kv_heads) + static_cast<size_t>(h)) * row;
        EXPECT_EQ(std::memcmp(p.k.data() + at, k.data() + from, row), 0) << "slot " << slots[t] << " head " << h;
        EXPECT_EQ(std::memcmp(p.v.data() + at, v.data() + from, row), 0) << "slot " << slots[t] << " head " << h;
        for (size_t b = 0; b < row; ++b) written[at + b] = true;
      }
    }
    for (size_t i = 0; i < p.k.size(); ++i) {
      if (!written[i]) {
        ASSERT_TRUE(p.k[i] == 0xFF && p.v[i] == 0xFF) << "byte " << i << " written";
      }
    }
    std::vector<unsigned char> k_back(bytes), v_back(bytes);
    ASSERT_TRUE(backend->read_kv(1, slots, k_back.data(), v_back.data()).ok());
    EXPECT_EQ(k_back, k);
    EXPECT_EQ(v_back, v);
  }
}

}  // namespace
}  // namespace pagoda::testing
