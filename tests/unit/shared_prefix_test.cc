// Shared prefixes are read once (docs/design.md, "Shared prefixes"): a batch of
// forks reads each whole chunk their blocks share one time, and every
// sequence's output bits are those of the same K/V held unshared (twins in
// blocks of their own), of the sequence decoded alone, and of any batch.
#include <gtest/gtest.h>

#include <random>
#include <string>
#include <vector>

#include "reference/decode_table.h"
#include "unit/cache_fixture.h"

namespace pagoda::testing {
namespace {

constexpr int32_t kParent = 1100;  // two whole chunks of 512 and a partial one
constexpr int32_t kForks = 5;
constexpr int32_t kSplit = 512;

CacheGeometry geometry(DType cache) {
  CacheGeometry g;
  g.num_layers = 1;
  g.num_kv_heads = 2;
  g.num_q_heads = 8;
  g.head_dim = 64;
  g.block_size = 16;
  g.dtype = cache;
  g.num_blocks = 1024;
  return g;
}

std::vector<float> random_rows(std::mt19937_64& rng, const CacheGeometry& g, int32_t n) {
  std::normal_distribution<float> dist(0.f, 1.f);
  std::vector<float> rows(static_cast<size_t>(n) * g.num_kv_heads * g.head_dim);
  for (float& x : rows) x = dist(rng);
  return rows;
}

struct Case {
  const char* name;
  DType cache;
  DecodeVariant variant;  // q_lengths, when set, are per fork
};

class SharedPrefix : public ::testing::TestWithParam<Case> {};

TEST_P(SharedPrefix, ForksReadSharedChunksOnceWithTheBitsOfUnsharedTwinsAndOfEachAlone) {
  const Case& c = GetParam();
  FixtureOptions o{geometry(c.cache), 2, 7};
  if (is_fp8(c.cache)) o.kv_scales = {KvScale{0.5f, 0.25f}};
  CacheFixture f(o);
  const CacheGeometry& g = f.geometry();
  std::mt19937_64 rng(11);
  const std::vector<float> pk = random_rows(rng, g, kParent);
  const std::vector<float> pv = random_rows(rng, g, kParent);
  const SequenceId parent = f.cache().create("parent");
  f.append_rows(parent, 0, kParent, pk, pv);

  // Each fork appends tokens of its own (a different count each, so that the
  // batch mixes lengths); its twin holds the same K/V in blocks of its own.
  std::vector<SequenceId> forks, twins;
  for (int32_t i = 0; i < kForks; ++i) {
    auto fork = f.cache().fork(parent);
    ASSERT_TRUE(fork.ok()) << fork.status().message();
    const int32_t own = 3 + 7 * i;
    const std::vector<float> k = random_rows(rng, g, own);
    const std::vector<float> v = random_rows(rng, g, own);
    f.append_rows(*fork, 0, own, k, v);
    const SequenceId twin = f.cache().create("twin");
    f.append_rows(twin, 0, kParent, pk, pv);
    f.append_rows(twin, 0, own, k, v);
    forks.push_back(*fork);
    twins.push_back(twin);
  }

  DecodeVariant variant = c.variant;
  std::vector<int32_t> rows_of(kForks, 1);
  if (!variant.q_lengths.empty()) rows_of.assign(kForks, variant.q_lengths[0]);
  variant.q_lengths = rows_of;
  int32_t rows = 0;
  for (int32_t n : rows_of) rows += n;
  const auto q = f.random_queries(rows, DType::kFloat32);
  const float scale = 0.125f;

  const auto shared = f.decode(0, forks, q, scale, SplitMode::kDeterministic, kSplit, variant);
  const auto unshared = f.decode(0, twins, q, scale, SplitMode::kDeterministic, kSplit, variant);
  // Sharing happened: forks read their two common whole chunks once.
  const int64_t token_bytes = g.token_kv_bytes();
  EXPECT_GT(shared.kv_bytes_shared, 0);
  EXPECT_EQ(shared.kv_bytes_read + shared.kv_bytes_shared, unshared.kv_bytes_read);
  EXPECT_EQ(unshared.kv_bytes_shared, 0);
  if (c.variant.window == 0) {
    EXPECT_EQ(shared.kv_bytes_shared, (kForks - 1) * 2 * kSplit * token_bytes);
  }
  EXPECT_EQ(shared.out_bytes, unshared.out_bytes) << "a shared chunk changed the bits";
  EXPECT_EQ(shared.lse, unshared.lse);
  EXPECT_EQ(shared.splits, unshared.splits);

  // Each fork alone, and the forks in reverse order with the twins between.
  const size_t row_elems = static_cast<size_t>(g.num_q_heads) * g.head_dim;
  int32_t row = 0;
  for (int32_t i = 0; i < kForks; ++i) {
    CacheFixture::Queries qi = q;
    qi.values.assign(q.values.begin() + row * row_elems, q.values.begin() + (row + rows_of[i]) * row_elems);
    qi.bytes.assign(q.bytes.begin() + row * row_elems * 4, q.bytes.begin() + (row + rows_of[i]) * row_elems * 4);
    DecodeVariant vi = variant;
    vi.q_lengths = {rows_of[i]};
    const auto alone = f.decode(0, {forks[i]}, qi, scale, SplitMode::kDeterministic, kSplit, vi);
    const std::vector<uint8_t> in_batch(shared.out_bytes.begin() + row * row_elems * 4,
                                        shared.out_bytes.begin() + (row + rows_of[i]) * row_elems * 4);
    EXPECT_EQ(alone.out_bytes, in_batch) << "fork " << i << " alone differs from the shared batch";
    EXPECT_EQ(alone.kv_bytes_shared, 0);
    row += rows_of[i];
  }

  // And against the reference (the mirror of what each fork holds).
  const Arithmetic arithmetic = arithmetic_of("cpu", f.geometry());
  const ReferenceResult ref = f.reference(0, forks, as_multiplied(q, arithmetic), scale, variant);
  expect_matches_reference(shared.out, shared.lse, ref, DType::kFloat32, arithmetic);
}

DecodeVariant with_rows(int32_t n) {
  DecodeVariant v;
  v.q_lengths = {n};
  return v;
}
DecodeVariant with_window(int32_t w) {
  DecodeVariant v;
  v.window = w;
  return v;
}
DecodeVariant with_cap_and_sinks() {
  DecodeVariant v;
  v.soft_cap = 20.f;
  v.sinks = {0.5f, -1.f, 2.f, 0.f, 1.f, -3.f, 0.25f, 4.f};
  return v;
}

INSTANTIATE_TEST_SUITE_P(
    Variants, SharedPrefix,
    ::testing::Values(Case{"fp16", DType::kFloat16, {}}, Case{"bf16", DType::kBFloat16, {}},
                      Case{"fp32", DType::kFloat32, {}}, Case{"fp8_e4m3", DType::kFloat8E4M3, {}},
                      Case{"fp8_e5m2", DType::kFloat8E5M2, {}}, Case{"rows3", DType::kFloat16, with_rows(3)},
                      Case{"window700", DType::kFloat16, with_window(700)},
                      Case{"softcap_sinks", DType::kBFloat16, with_cap_and_sinks()}),
    [](const ::testing::TestParamInfo<Case>& info) { return std::string(info.param.name); });

}  // namespace
}  // namespace pagoda::testing
