// The fixture's compared backends (FixtureOptions::also) hold the cache its
// manager built: the same blocks, the copy-on-write copies of forks included,
// so a decode on either gives the same bits (both CPU here; the CUDA tests
// compare the GPU with the CPU the same way).
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "unit/cache_fixture.h"

namespace pagoda::testing {
namespace {

CacheGeometry small_geometry() {
  CacheGeometry g;
  g.num_layers = 2;
  g.num_kv_heads = 2;
  g.num_q_heads = 4;
  g.head_dim = 64;
  g.block_size = 16;
  g.dtype = DType::kFloat16;
  g.num_blocks = 32;
  return g;
}

TEST(CacheFixtureCompared, ABackendGivenEveryWriteDecodesToTheSameBits) {
  FixtureOptions options(small_geometry(), 1, 9);
  options.also = {"cpu"};
  CacheFixture f(options);
  ASSERT_EQ(f.backends(), 2u);
  const int32_t layer = 1;
  const CacheFixture::Queries spike_q = f.random_queries(3, DType::kFloat32);
  std::vector<SequenceId> ids = f.add_sequences(layer, {40, 17, 33}, &spike_q);

  // Interleaved: the first sequence's second block is not next to its first.
  {
    const Reservation r = f.pin(layer, {ids[0]});
    const BatchBlockTables t = r.tables();
    EXPECT_NE(t.block_of(0, 16, 16), t.block_of(0, 0, 16) + 1);
  }

  // A fork appended to copies its last, partly filled block.
  auto child = f.cache().fork(ids[0]);
  ASSERT_TRUE(child.ok()) << child.status().message();
  f.append_random(*child, layer, 5);
  ids.push_back(*child);
  f.append_random(ids[0], layer, 3);

  const CacheFixture::Queries q = f.random_queries(4, DType::kFloat16);
  const CacheFixture::Decoded a = f.decode_on(0, layer, ids, q, 0.125f);
  const CacheFixture::Decoded b = f.decode_on(1, layer, ids, q, 0.125f);
  EXPECT_EQ(a.out_bytes, b.out_bytes);
  EXPECT_EQ(a.lse, b.lse);
  for (float x : a.out) ASSERT_TRUE(std::isfinite(x)) << "a read reached a NaN-poisoned row";
}

TEST(CacheFixtureCompared, ValueRowIsTheStoredRow) {
  CacheFixture f(FixtureOptions(small_geometry(), 1, 4));
  const std::vector<SequenceId> ids = f.add_sequences(0, {1});
  const CacheFixture::Queries q = f.random_queries(1, DType::kFloat32);
  // One key: the output is that key's value row exactly.
  const CacheFixture::Decoded d = f.decode(0, ids, q, 0.1f);
  const CacheGeometry& g = f.geometry();
  for (int32_t h = 0; h < g.num_q_heads; ++h) {
    const std::vector<double> v = f.value_row(0, ids[0], 0, h / g.group_size());
    for (int32_t i = 0; i < g.head_dim; ++i) ASSERT_EQ(d.out[h * g.head_dim + i], static_cast<float>(v[i]));
  }
}

}  // namespace
}  // namespace pagoda::testing
