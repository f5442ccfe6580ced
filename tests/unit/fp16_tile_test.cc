// A 16-bit-float view of the cache shared by many row blocks, read through an
// fp32 tile widened once or by each block where it lies (force_fp16_tile; each
// CPU family has its default): AVX-512's quad scores of an fp16 cache, and on
// AVX2 an fp16 or bf16 cache's tasks of 9 to 16 rows (bf16 in the paired order
// either way) and an fp8 cache's fp16 tile past four rows. Either way the same
// values in the same order, so the same bits: the deterministic mode's groups
// of 4 to 16 with one to four query rows (whole and padded row blocks, short
// and long runs) and the fast mode's GQA 4 with four query rows. Both reads are
// also held to the reference. A target the CPU lacks skips and says so.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "pagoda/cpu_targets.h"
#include "pagoda/dtype.h"
#include "reference/decode_table.h"
#include "unit/cache_fixture.h"
#include "unit/on_simd_target.h"

namespace pagoda::testing {
namespace {

struct TileCase {
  int32_t head_dim;
  int32_t gqa;
  int32_t block_size;
  int32_t q_len;
  SplitMode mode;
  DType dtype = DType::kFloat16;
};

class Fp16Tile : public OnSimdTarget {
 protected:
  void TearDown() override {
    cpu::force_fp16_tile(std::nullopt);
    OnSimdTarget::TearDown();
  }
};

TEST_P(Fp16Tile, TileAndInPlaceGiveTheSameBits) {
  // AVX-512 reads quads from GQA 8 up (and in fast mode past two row blocks);
  // AVX2 reads fp16 and bf16 in place up to 16 rows: GQA 4 with three and
  // four query rows, GQA 8 with two, GQA 5 with three (15 rows, a padded
  // block), GQA 16 with one; and fp8 through its fp16 tile from 8 to 64 rows.
  const TileCase cases[] = {
      {128, 8, 16, 1, SplitMode::kDeterministic},
      {128, 8, 16, 4, SplitMode::kDeterministic},
      {64, 10, 3, 1, SplitMode::kDeterministic},
      {128, 12, 7, 4, SplitMode::kDeterministic},
      {256, 16, 16, 1, SplitMode::kDeterministic},
      {128, 4, 16, 4, SplitMode::kFast},
      {128, 4, 16, 4, SplitMode::kDeterministic},
      {256, 4, 7, 3, SplitMode::kDeterministic},
      {128, 8, 16, 2, SplitMode::kDeterministic},
      {128, 5, 16, 3, SplitMode::kDeterministic},
      {64, 16, 3, 1, SplitMode::kDeterministic},
      {128, 8, 16, 1, SplitMode::kDeterministic, DType::kFloat8E4M3},
      {128, 4, 16, 4, SplitMode::kDeterministic, DType::kFloat8E4M3},
      {64, 12, 7, 3, SplitMode::kDeterministic, DType::kFloat8E4M3},
      {128, 8, 16, 2, SplitMode::kFast, DType::kFloat8E5M2},
      {128, 16, 3, 4, SplitMode::kDeterministic, DType::kFloat8E5M2},
      {128, 4, 16, 4, SplitMode::kDeterministic, DType::kBFloat16},
      {256, 4, 7, 3, SplitMode::kDeterministic, DType::kBFloat16},
      {64, 5, 3, 3, SplitMode::kDeterministic, DType::kBFloat16},
      {128, 16, 16, 1, SplitMode::kFast, DType::kBFloat16},
  };
  for (const TileCase& c : cases) {
    SCOPED_TRACE(::testing::Message() << "d" << c.head_dim << " gqa" << c.gqa << " bs" << c.block_size << " q_len "
                                      << c.q_len << (c.mode == SplitMode::kFast ? " fast " : " deterministic ")
                                      << dtype_name(c.dtype));
    CacheGeometry g;
    g.num_layers = 1;
    g.num_kv_heads = 2;
    g.num_q_heads = 2 * c.gqa;
    g.head_dim = c.head_dim;
    g.block_size = c.block_size;
    g.dtype = c.dtype;
    g.num_blocks = 2 * (700 / c.block_size + 4);
    FixtureOptions o;
    o.geometry = g;
    o.seed = 17;
    CacheFixture f(o);
    const std::vector<int32_t> lengths = {5, 333, 700};
    const std::vector<SequenceId> ids = f.add_sequences(0, lengths);
    CacheFixture::Variant rows;
    rows.q_lengths.assign(ids.size(), c.q_len);
    const auto q = f.random_queries(static_cast<int32_t>(ids.size()) * c.q_len, DType::kFloat32);
    const float scale = 1.f / std::sqrt(static_cast<float>(c.head_dim));

    cpu::force_fp16_tile(true);
    ASSERT_TRUE(cpu::fp16_tile_serves());
    const auto tile = f.decode(0, ids, q, scale, c.mode, 128, rows);
    cpu::force_fp16_tile(false);
    ASSERT_FALSE(cpu::fp16_tile_serves());
    const auto in_place = f.decode(0, ids, q, scale, c.mode, 128, rows);

    ASSERT_EQ(tile.out.size(), in_place.out.size());
    ASSERT_EQ(tile.lse.size(), in_place.lse.size());
    EXPECT_EQ(std::memcmp(tile.out.data(), in_place.out.data(), tile.out.size() * sizeof(float)), 0);
    EXPECT_EQ(std::memcmp(tile.lse.data(), in_place.lse.data(), tile.lse.size() * sizeof(float)), 0);

    const auto want = f.reference(0, ids, q, scale, rows);
    const ErrorStats e = compare(want.out, tile.out);
    EXPECT_FALSE(e.has_nan);
    EXPECT_LE(e.max_abs, 2e-5) << "a cache read exactly (the reference holds its stored values), accumulated in fp32";
  }
}

INSTANTIATE_TEST_SUITE_P(Targets, Fp16Tile, ::testing::Values("avx3", "avx2"), simd_target_name);

}  // namespace
}  // namespace pagoda::testing
