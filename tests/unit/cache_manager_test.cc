#include "cache_manager.h"

#include <gtest/gtest.h>

#include <thread>

#include "unit/cache_fixture.h"

namespace pagoda::testing {
namespace {

CacheGeometry small(int32_t blocks) {
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

std::vector<float> rows(int32_t n, float value) { return std::vector<float>(static_cast<size_t>(n) * 64, value); }

TEST(CacheManager, LayersHaveTheirOwnLengthsAndShareBlocks) {
  CacheFixture f({small(8), 1, 1});
  const SequenceId id = f.add_sequence(0, 6);
  f.append_random(id, 1, 3);
  auto info = f.cache().info(id);
  ASSERT_TRUE(info.ok());
  EXPECT_EQ(info->layer_lengths, (std::vector<int32_t>{6, 3}));
  EXPECT_EQ(info->blocks_held, 2);
  EXPECT_EQ(f.cache().free_blocks(), 6);
}

TEST(CacheManager, ExhaustionIsAllOrNothingAcrossSequences) {
  CacheFixture f({small(4), 1, 1});
  const SequenceId a = f.add_sequence(0, 7);  // 2 blocks, 1 free slot in the last
  const SequenceId b = f.add_sequence(0, 4);  // 1 block, full
  ASSERT_EQ(f.cache().free_blocks(), 1);
  // a needs no block for one more token, b needs one, c needs one: 2 > 1 free.
  const SequenceId c = f.cache().create("c");
  const SequenceId ids[] = {a, b, c};
  const auto k = rows(3, 1.f);
  const AppendRows r{1, k.data(), k.data(), DType::kFloat32};
  auto lease = f.cache().acquire(0, ids, &r);
  ASSERT_FALSE(lease.ok());
  EXPECT_EQ(lease.status().code(), StatusCode::kResourceExhausted);
  EXPECT_EQ(f.cache().free_blocks(), 1);
  EXPECT_EQ(f.cache().info(a)->layer_lengths[0], 7);
  EXPECT_EQ(f.cache().info(b)->layer_lengths[0], 4);
  EXPECT_EQ(f.cache().info(c)->blocks_held, 0);
  // The outputs over the untouched sequences still match the reference.
  const auto q = f.random_queries(2, DType::kFloat32);
  const auto got = f.decode(0, {a, b}, q, 0.125f);
  const auto want = f.reference(0, {a, b}, q, 0.125);
  EXPECT_LE(compare(want.out, got.out).max_abs, 2e-5);
  // A single append that fits still works afterwards.
  const auto k1 = rows(1, 2.f);
  EXPECT_TRUE(f.cache().append(a, 0, 1, k1.data(), k1.data(), DType::kFloat32).ok());
}

TEST(CacheManager, ErrorsNameTheFieldAndChangeNothing) {
  CacheFixture f({small(4), 1, 1});
  const SequenceId a = f.add_sequence(0, 3);
  const auto k = rows(1, 1.f);
  auto bad_layer = f.cache().append(a, 2, 1, k.data(), k.data(), DType::kFloat32);
  EXPECT_EQ(bad_layer.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(bad_layer.status().message().find("layer: expected [0, 2), received 2"), std::string::npos)
      << bad_layer.status().message();
  auto unknown = f.cache().append(999, 0, 1, k.data(), k.data(), DType::kFloat32);
  EXPECT_EQ(unknown.status().code(), StatusCode::kNotFound);
  const SequenceId dup[] = {a, a};
  auto dup_lease = f.cache().acquire(0, dup);
  EXPECT_EQ(dup_lease.status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(f.cache().free(12345).code(), StatusCode::kNotFound);
  EXPECT_EQ(f.cache().info(a)->layer_lengths[0], 3);
}

TEST(CacheManager, ForkSharesBlocksAndCopiesOnWrite) {
  CacheFixture f({small(16), 1, 1});
  const SequenceId parent = f.add_sequence(0, 6);  // last block half full
  const int32_t free_before = f.cache().free_blocks();
  auto child = f.cache().fork(parent);
  ASSERT_TRUE(child.ok());
  EXPECT_EQ(f.cache().free_blocks(), free_before);  // nothing copied yet

  const auto q = f.random_queries(1, DType::kFloat32);
  const auto parent_before = f.decode(0, {parent}, q, 0.125f);
  f.append_random(*child, 0, 1);  // writes into the shared last block
  EXPECT_EQ(f.cache().free_blocks(), free_before - 1);  // the copy
  const auto parent_after = f.decode(0, {parent}, q, 0.125f);
  EXPECT_EQ(parent_before.out_bytes, parent_after.out_bytes) << "the parent saw the child's write";

  const auto child_out = f.decode(0, {*child}, q, 0.125f);
  const auto want = f.reference(0, {*child}, q, 0.125);
  EXPECT_LE(compare(want.out, child_out.out).max_abs, 2e-5);
  EXPECT_EQ(f.cache().info(*child)->layer_lengths[0], 7);
  EXPECT_EQ(f.cache().info(parent)->layer_lengths[0], 6);
  // The parent now owns its last block alone and writes in place.
  f.append_random(parent, 0, 1);
  EXPECT_EQ(f.cache().free_blocks(), free_before - 1);
}

TEST(CacheManager, FreeReturnsBlocksWhenTheLastReferenceGoes) {
  CacheFixture f({small(8), 1, 1});
  const int32_t total = f.cache().free_blocks();
  const SequenceId a = f.add_sequence(0, 9);  // 3 blocks
  auto b = f.cache().fork(a);
  ASSERT_TRUE(b.ok());
  EXPECT_TRUE(f.cache().free(a).ok());
  EXPECT_EQ(f.cache().free_blocks(), total - 3);  // still held by the fork
  {
    const SequenceId ids[] = {*b};
    auto lease = f.cache().acquire(0, ids);
    ASSERT_TRUE(lease.ok());
    EXPECT_TRUE(f.cache().free(*b).ok());
    EXPECT_EQ(f.cache().free_blocks(), total - 3);  // pinned by the lease
  }
  EXPECT_EQ(f.cache().free_blocks(), total);
  EXPECT_EQ(f.cache().num_sequences(), 0u);
}

TEST(CacheManager, LeaseSeesTheLengthItWasTakenAt) {
  CacheFixture f({small(16), 1, 1});
  const SequenceId a = f.add_sequence(0, 5);
  const auto q = f.random_queries(1, DType::kFloat32);
  const auto before = f.decode(0, {a}, q, 0.125f);
  auto lease = f.cache().acquire_prefix(a, 0, 5);
  ASSERT_TRUE(lease.ok());
  f.append_random(a, 0, 4);  // copies the pinned last block, writes the copy
  DecodeLaunch launch;
  launch.tables = lease->tables();
  launch.q = q.bytes.data();
  launch.scale = 0.125f;
  std::vector<uint8_t> out(before.out_bytes.size());
  DecodeOutputs o;
  o.out = out.data();
  ASSERT_TRUE(f.backend().decode(launch, o).ok());
  EXPECT_EQ(out, before.out_bytes);
  EXPECT_EQ(f.cache().acquire_prefix(a, 0, 10).status().code(), StatusCode::kInvalidArgument);
}

TEST(CacheManager, ConcurrentAppendsOnDistinctSequences) {
  CacheFixture f({small(512), 1, 1});
  constexpr int kThreads = 4;
  constexpr int kSteps = 100;
  std::vector<SequenceId> ids;
  for (int i = 0; i < kThreads; ++i) ids.push_back(f.cache().create("t"));
  std::vector<std::thread> workers;
  for (int i = 0; i < kThreads; ++i) {
    workers.emplace_back([&, i] {
      const auto k = rows(1, static_cast<float>(i));
      for (int s = 0; s < kSteps; ++s) {
        auto r = f.cache().append(ids[i], s % 2, 1, k.data(), k.data(), DType::kFloat32);
        ASSERT_TRUE(r.ok()) << r.status().message();
      }
    });
  }
  for (auto& w : workers) w.join();
  int32_t held = 0;
  for (int i = 0; i < kThreads; ++i) {
    auto info = f.cache().info(ids[i]);
    EXPECT_EQ(info->layer_lengths, (std::vector<int32_t>{kSteps / 2, kSteps / 2}));
    held += info->blocks_held;
    // Each sequence's keys are all its own value: no slot was shared or lost.
    const auto q = f.random_queries(1, DType::kFloat32);
    const auto got = f.decode(0, {ids[i]}, q, 0.125f);
    for (size_t e = 0; e < 64; ++e) EXPECT_NEAR(got.out[e], static_cast<float>(i), 1e-5);
  }
  EXPECT_EQ(held, kThreads * ((kSteps / 2 + 3) / 4));
  EXPECT_EQ(f.cache().free_blocks(), 512 - held);
}

}  // namespace
}  // namespace pagoda::testing
