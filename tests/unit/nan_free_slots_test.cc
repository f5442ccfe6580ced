// The e4m3 cache's NaN-free marks (kernels/cpu/nan_free_slots.h): how writes,
// copies and poisoning move them; that the service's own path (finite appends)
// marks what it writes, so the kernels skip their scan there; and that a NaN
// code written by another path still reaches the output: a raw write (an
// import's) inside a marked block, and a fork's copy of a block holding one.
// Each SIMD target the CPU has; one it lacks skips and says so.
#include <gtest/gtest.h>

#include <atomic>
#include <cmath>
#include <cstdint>
#include <vector>

#include "cpu/cpu_backend_impl.h"
#include "cpu/nan_free_slots.h"
#include "unit/cache_fixture.h"
#include "unit/on_simd_target.h"

namespace pagoda::testing {
namespace {

CacheGeometry e4m3_geometry() {
  CacheGeometry g;
  g.num_layers = 2;
  g.num_kv_heads = 2;
  g.num_q_heads = 8;  // GQA 4: the FMAs read the codes in place (AVX2 through their fp16 tile)
  g.head_dim = 64;
  g.block_size = 16;
  g.dtype = DType::kFloat8E4M3;
  g.num_blocks = 16;
  return g;
}

int32_t mark(const std::atomic<int32_t>* layer, int32_t block) { return layer[block].load(); }

TEST(NanFreeSlots, TrackOnlyAnE4m3Cache) {
  CacheGeometry g = e4m3_geometry();
  for (DType t : {DType::kFloat16, DType::kBFloat16, DType::kFloat32, DType::kFloat8E5M2}) {
    g.dtype = t;
    cpu::NanFreeSlots slots(g);
    EXPECT_FALSE(slots.tracking()) << dtype_name(t);
    EXPECT_EQ(slots.layer(0), nullptr) << dtype_name(t);
    slots.wrote(0, 1, 0, true);  // nothing to track: no effect
    slots.copied(1, 2);
    slots.poisoned(1);
  }
  g.dtype = DType::kFloat8E4M3;
  EXPECT_TRUE(cpu::NanFreeSlots(g).tracking());
}

TEST(NanFreeSlots, MarksMoveWithWritesCopiesAndPoison) {
  cpu::NanFreeSlots slots(e4m3_geometry());
  const std::atomic<int32_t>* l0 = slots.layer(0);
  const std::atomic<int32_t>* l1 = slots.layer(1);
  EXPECT_EQ(mark(l0, 2), 0);  // nothing written: nothing known
  for (int32_t s = 0; s < 5; ++s) slots.wrote(0, 2, s, false);
  EXPECT_EQ(mark(l0, 2), 5);
  EXPECT_EQ(mark(l1, 2), 0);  // layers apart
  EXPECT_EQ(mark(l0, 1), 0);  // blocks apart
  slots.wrote(0, 2, 9, false);  // past the mark: slots 5 to 8 are still unknown
  EXPECT_EQ(mark(l0, 2), 5);
  EXPECT_TRUE(cpu::known_nan_free(l0, 2, 0, 5));
  EXPECT_TRUE(cpu::known_nan_free(l0, 2, 3, 2));
  EXPECT_FALSE(cpu::known_nan_free(l0, 2, 0, 6));
  EXPECT_FALSE(cpu::known_nan_free(l0, 2, 4, 2));
  EXPECT_FALSE(cpu::known_nan_free(nullptr, 2, 0, 1));

  slots.wrote(0, 2, 2, true);  // a NaN code pulls the mark back to its slot
  EXPECT_EQ(mark(l0, 2), 2);
  slots.wrote(0, 2, 4, false);  // a finite write above it does not clear it
  EXPECT_EQ(mark(l0, 2), 2);
  slots.wrote(0, 2, 2, false);  // overwritten: the slot is finite again
  EXPECT_EQ(mark(l0, 2), 3);
  slots.wrote(0, 2, 7, true);  // a NaN code past the mark leaves it
  EXPECT_EQ(mark(l0, 2), 3);

  for (int32_t s = 0; s < 16; ++s) slots.wrote(1, 2, s, false);
  slots.copied(2, 3);  // every layer takes the source's mark
  EXPECT_EQ(mark(l0, 3), 3);
  EXPECT_EQ(mark(l1, 3), 16);
  slots.poisoned(3);
  EXPECT_EQ(mark(l0, 3), 0);
  EXPECT_EQ(mark(l1, 3), 0);
  EXPECT_EQ(mark(l1, 2), 16);
}

class NanFreeReads : public OnSimdTarget {
 protected:
  static const std::atomic<int32_t>* marks(CacheFixture& f, int32_t layer) {
    return dynamic_cast<cpu::CpuBackend&>(f.backend()).nan_free_slots().layer(layer);
  }

  // Overwrites element `i` of token `token`'s V row in KV head 0 with the NaN
  // code, through a raw write of the token's bytes.
  static void write_nan_code(CacheFixture& f, int32_t layer, SequenceId id, int32_t token, int32_t i) {
    const CacheGeometry& g = f.geometry();
    const std::vector<int32_t> table = f.cache().block_table(id);
    const int64_t slot = static_cast<int64_t>(table[static_cast<size_t>(token / g.block_size)]) * g.block_size +
                         token % g.block_size;
    std::vector<uint8_t> k(static_cast<size_t>(g.num_kv_heads * g.head_dim));
    std::vector<uint8_t> v(k.size());
    ASSERT_TRUE(f.stream().read_kv(layer, {&slot, 1}, k.data(), v.data()).ok());
    v[static_cast<size_t>(i)] = 0x7F;
    ASSERT_TRUE(f.stream().write_kv_raw(layer, {&slot, 1}, k.data(), v.data()).ok());
  }
};

// Finite appends mark every slot they fill: the decode reads those runs
// without scanning them. A NaN code written raw into token 20 (block 1) pulls
// that block's mark back: V's element 5 reads NaN in every head of KV head 0's
// group, and everything else keeps its bits.
TEST_P(NanFreeReads, ARawNanCodeInsideAMarkedBlockIsRead) {
  FixtureOptions o(e4m3_geometry(), 1, 11);
  CacheFixture f(o);
  const int32_t layer = 1;
  const SequenceId id = f.add_sequence(layer, 40);
  const std::vector<int32_t> table = f.cache().block_table(id);
  ASSERT_EQ(table.size(), 3u);
  EXPECT_EQ(mark(marks(f, layer), table[0]), 16);
  EXPECT_EQ(mark(marks(f, layer), table[1]), 16);
  EXPECT_EQ(mark(marks(f, layer), table[2]), 8);

  const CacheFixture::Queries q = f.random_queries(1, DType::kFloat32);
  const CacheFixture::Decoded before = f.decode(layer, {id}, q, 0.125f);
  write_nan_code(f, layer, id, 20, 5);
  EXPECT_EQ(mark(marks(f, layer), table[1]), 4);
  const CacheFixture::Decoded after = f.decode(layer, {id}, q, 0.125f);

  const CacheGeometry& g = f.geometry();
  ASSERT_EQ(after.out.size(), before.out.size());
  for (size_t i = 0; i < after.out.size(); ++i) {
    const auto head = static_cast<int32_t>(i / static_cast<size_t>(g.head_dim));
    if (head < g.group_size() && i % static_cast<size_t>(g.head_dim) == 5) {
      EXPECT_TRUE(std::isnan(after.out[i])) << "head " << head;
    } else {
      EXPECT_EQ(after.out[i], before.out[i]) << "head " << head << ", element " << i % g.head_dim;
    }
  }
  EXPECT_EQ(after.lse, before.lse);
}

// A fork appended to copies its parent's last, partly filled block: the copy
// takes that block's mark, so a NaN code there is read through the fork too.
// The copy lands in blocks a freed sequence had filled, marked NaN-free.
TEST_P(NanFreeReads, AForkCopiesTheMarkOfABlockHoldingANanCode) {
  FixtureOptions o(e4m3_geometry(), 1, 12);
  CacheFixture f(o);
  const int32_t layer = 0;
  const SequenceId id = f.add_sequence(layer, 40);
  write_nan_code(f, layer, id, 36, 5);
  const SequenceId filler = f.add_sequence(layer, 16 * 8);
  for (int32_t block : f.cache().block_table(filler)) ASSERT_EQ(mark(marks(f, layer), block), 16);
  ASSERT_TRUE(f.cache().free(filler).ok());
  auto child = f.cache().fork(id);
  ASSERT_TRUE(child.ok()) << child.status().message();
  f.append_random(*child, layer, 3);
  const std::vector<int32_t> parent_table = f.cache().block_table(id);
  const std::vector<int32_t> child_table = f.cache().block_table(*child);
  ASSERT_NE(child_table[2], parent_table[2]) << "the fork's append copies the shared last block";
  EXPECT_EQ(mark(marks(f, layer), child_table[2]), 4);

  const CacheFixture::Decoded got = f.decode(layer, {*child}, f.random_queries(1, DType::kFloat32), 0.125f);
  const CacheGeometry& g = f.geometry();
  for (size_t i = 0; i < got.out.size(); ++i) {
    const auto head = static_cast<int32_t>(i / static_cast<size_t>(g.head_dim));
    if (head < g.group_size() && i % static_cast<size_t>(g.head_dim) == 5) {
      EXPECT_TRUE(std::isnan(got.out[i])) << "head " << head;
    } else {
      EXPECT_TRUE(std::isfinite(got.out[i])) << "head " << head << ", element " << i % g.head_dim;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Targets, NanFreeReads, ::testing::Values("best", "avx3", "avx2"), simd_target_name);

}  // namespace
}  // namespace pagoda::testing
