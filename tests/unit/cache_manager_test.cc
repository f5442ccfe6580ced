#include "cache/cache_manager.h"

#include <gtest/gtest.h>

#include <thread>

#include "unit/cache_fixture.h"

namespace pagoda::testing {
namespace {


std::vector<float> rows(int32_t n, float value) { return std::vector<float>(static_cast<size_t>(n) * 64, value); }

// One request appending one token of `k` to each of `ids` on `layer`, as a
// Decode with k/v does: reserve, finish, then release.
Status append_batch(CacheFixture& f, int32_t layer, const std::vector<SequenceId>& ids, const std::vector<float>& k) {
  Reservation r;
  f.cache().begin(layer, true, r);
  ReserveRequest request;
  request.ids = ids;
  request.new_tokens_each = 1;
  PAGODA_RETURN_IF_ERROR(f.cache().reserve(r, request));
  const KvSource source{k.data(), k.data(), DType::kFloat32};
  return f.cache().finish(r, f.stream(), std::span<const KvSource>(&source, 1));
}

TEST(CacheManager, LayersHaveTheirOwnLengthsAndShareBlocks) {
  CacheFixture f({bookkeeping_geometry(8), 1, 1});
  const SequenceId id = f.add_sequence(0, 6);
  f.append_random(id, 1, 3);
  auto info = f.cache().info(id);
  ASSERT_TRUE(info.ok());
  EXPECT_EQ(info->layer_lengths, (std::vector<int32_t>{6, 3}));
  EXPECT_EQ(info->blocks_held, 2);
  EXPECT_EQ(f.cache().free_blocks(), 6);
}

TEST(CacheManager, ExhaustionIsAllOrNothingAcrossSequences) {
  CacheFixture f({bookkeeping_geometry(4), 1, 1});
  const SequenceId a = f.add_sequence(0, 7);  // 2 blocks, 1 free slot in the last
  const SequenceId b = f.add_sequence(0, 4);  // 1 block, full
  ASSERT_EQ(f.cache().free_blocks(), 1);
  // a needs no block for one more token, b needs one, c needs one: 2 > 1 free.
  const SequenceId c = f.cache().create("c");
  const Status s = append_batch(f, 0, {a, b, c}, rows(3, 1.f));
  EXPECT_EQ(s.code(), StatusCode::kResourceExhausted) << s.message();
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
  EXPECT_TRUE(f.cache().append(f.stream(), a, 0, 1, k1.data(), k1.data(), DType::kFloat32).ok());
}

TEST(CacheManager, ErrorsNameTheFieldAndChangeNothing) {
  CacheFixture f({bookkeeping_geometry(4), 1, 1});
  const SequenceId a = f.add_sequence(0, 3);
  const auto k = rows(1, 1.f);
  // (A bad layer never gets here: admission refuses it, tests/e2e/errors_test.cc.)
  auto unknown = f.cache().append(f.stream(), 999, 0, 1, k.data(), k.data(), DType::kFloat32);
  EXPECT_EQ(unknown.status().code(), StatusCode::kNotFound);
  auto stale = f.cache().append(f.stream(), a, 0, 1, k.data(), k.data(), DType::kFloat32, 2);
  EXPECT_EQ(stale.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(stale.status().message().find("expected sequence"), std::string::npos) << stale.status().message();
  EXPECT_EQ(f.cache().free(12345).code(), StatusCode::kNotFound);
  EXPECT_EQ(f.cache().info(a)->layer_lengths[0], 3);
  EXPECT_EQ(f.cache().free_blocks(), 3);
}

TEST(CacheManager, ForkSharesBlocksAndCopiesOnWrite) {
  CacheFixture f({bookkeeping_geometry(16), 1, 1});
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

// A sequence and its fork appended in one request need the blocks the two
// appends need one after the other: one copy, then the last holder writes in place.
TEST(CacheManager, ForkPairInOneRequestNeedsWhatSeparateAppendsNeed) {
  CacheFixture f({bookkeeping_geometry(3), 1, 1});
  const SequenceId a = f.add_sequence(0, 6);  // 2 blocks, the last half full
  auto b = f.cache().fork(a);
  ASSERT_TRUE(b.ok());
  ASSERT_EQ(f.cache().free_blocks(), 1);
  const Status s = append_batch(f, 0, {a, *b}, rows(2, 3.f));
  ASSERT_TRUE(s.ok()) << s.message();
  EXPECT_EQ(f.cache().free_blocks(), 0);
  EXPECT_EQ(f.cache().info(a)->layer_lengths[0], 7);
  EXPECT_EQ(f.cache().info(*b)->layer_lengths[0], 7);
}

// A pin (an in-flight Decode's, the checker's) keeps blocks alive but does not
// share them: appending past the pinned length writes in place, no copy.
TEST(CacheManager, PinnedBlocksAreAppendedInPlace) {
  CacheFixture f({bookkeeping_geometry(16), 1, 1});
  const SequenceId a = f.add_sequence(0, 5);  // last block 1 of 4 slots used
  const int32_t free_before = f.cache().free_blocks();
  const auto q = f.random_queries(1, DType::kFloat32);
  const auto before = f.decode(0, {a}, q, 0.125f);
  const Reservation pinned = f.pin(0, {a});
  f.append_random(a, 0, 3);  // fills the pinned last block in place
  EXPECT_EQ(f.cache().free_blocks(), free_before);
  // The pin still reads the length it was taken at.
  DecodeLaunch launch;
  launch.tables = pinned.tables();
  launch.q = q.bytes.data();
  launch.scale = 0.125f;
  std::vector<uint8_t> out(before.out_bytes.size());
  DecodeOutputs o;
  o.out = out.data();
  ASSERT_TRUE(f.stream().decode(launch, o).ok());
  EXPECT_EQ(out, before.out_bytes);
  // And the sequence reads its new tokens.
  const auto after = f.decode(0, {a}, q, 0.125f);
  EXPECT_LE(compare(f.reference(0, {a}, q, 0.125).out, after.out).max_abs, 2e-5);
}

TEST(CacheManager, APinOutlivesAFreeAndThenReturnsTheBlocks) {
  CacheFixture f({bookkeeping_geometry(8), 1, 1});
  const int32_t total = f.cache().free_blocks();
  const SequenceId a = f.add_sequence(0, 9);  // 3 blocks
  auto b = f.cache().fork(a);
  ASSERT_TRUE(b.ok());
  EXPECT_TRUE(f.cache().free(a).ok());
  EXPECT_EQ(f.cache().free_blocks(), total - 3);  // still held by the fork
  {
    const Reservation pinned = f.pin(0, {*b});
    EXPECT_TRUE(f.cache().free(*b).ok());
    EXPECT_EQ(f.cache().free_blocks(), total - 3);  // pinned
    EXPECT_EQ(f.cache().info(*b).status().code(), StatusCode::kNotFound);
  }
  EXPECT_EQ(f.cache().free_blocks(), total);
  EXPECT_EQ(f.cache().num_sequences(), 0u);
}

// Pipelined steps of one sequence in one reservation (a stream's requests
// coalesced into one batch) each see the length the previous one left.
TEST(CacheManager, PartsOfOneReservationChainTheirAppends) {
  CacheFixture f({bookkeeping_geometry(8), 1, 1});
  const SequenceId a = f.add_sequence(0, 3);
  Reservation r;
  f.cache().begin(0, true, r);
  const SequenceId ids[] = {a};
  const int32_t expected[] = {3};
  ReserveRequest first;
  first.ids = ids;
  first.new_tokens_each = 1;
  first.expected_lengths = expected;
  ASSERT_TRUE(f.cache().reserve(r, first).ok());
  ReserveRequest second;
  second.ids = ids;
  second.new_tokens_each = 1;
  ASSERT_TRUE(f.cache().reserve(r, second).ok());
  EXPECT_EQ(std::vector<int32_t>(r.lengths().begin(), r.lengths().end()), (std::vector<int32_t>{4, 5}));
  EXPECT_EQ(f.cache().info(a)->layer_lengths[0], 3) << "committed only by finish";
  const auto k = rows(1, 5.f);
  const KvSource sources[] = {{k.data(), k.data(), DType::kFloat32}, {k.data(), k.data(), DType::kFloat32}};
  ASSERT_TRUE(f.cache().finish(r, f.stream(), sources).ok());
  EXPECT_EQ(f.cache().info(a)->layer_lengths[0], 5);
}

TEST(CacheManager, AReservationReleasedBeforeFinishRollsBackWhole) {
  CacheFixture f({bookkeeping_geometry(8), 1, 1});
  const SequenceId a = f.add_sequence(0, 4);  // one full block
  auto fork = f.cache().fork(a);
  ASSERT_TRUE(fork.ok());
  const int32_t free_before = f.cache().free_blocks();
  {
    Reservation r;
    f.cache().begin(0, true, r);
    const SequenceId ids[] = {a};
    ReserveRequest request;
    request.ids = ids;
    request.new_tokens_each = 5;  // one new block, and a second
    ASSERT_TRUE(f.cache().reserve(r, request).ok());
    EXPECT_EQ(f.cache().free_blocks(), free_before - 2);
  }
  EXPECT_EQ(f.cache().free_blocks(), free_before);
  EXPECT_EQ(f.cache().info(a)->layer_lengths[0], 4);
  EXPECT_EQ(f.cache().info(a)->blocks_held, 1);
  // The same append then works.
  f.append_random(a, 0, 5);
  const auto q = f.random_queries(1, DType::kFloat32);
  EXPECT_LE(compare(f.reference(0, {a}, q, 0.125).out, f.decode(0, {a}, q, 0.125f).out).max_abs, 2e-5);
}

// Truncation cuts every longer layer, returns whole blocks, and a later append
// writes into the kept partial block: in place when it is the sequence's own,
// after a copy when a fork shares it (the fork keeps its tokens).
TEST(CacheManager, TruncateThenAppendKeepsForksAndTheReferenceRight) {
  CacheFixture f({bookkeeping_geometry(32), 1, 1});
  const SequenceId a = f.add_sequence(0, 14);  // blocks of 4: 4 blocks
  f.append_random(a, 1, 6);
  auto fork = f.cache().fork(a);
  ASSERT_TRUE(fork.ok());
  const int32_t free_before = f.cache().free_blocks();
  auto cut = f.cache().truncate(a, 9);  // layer 0: 14 -> 9, layer 1: 6 stays
  ASSERT_TRUE(cut.ok()) << cut.status().message();
  EXPECT_EQ(*cut, (std::vector<int32_t>{9, 6}));
  EXPECT_EQ(f.cache().info(a)->blocks_held, 3);
  EXPECT_EQ(f.cache().free_blocks(), free_before) << "the fork still holds the dropped block";
  f.append_random(a, 0, 2);  // into block 2, shared with the fork: copied first
  EXPECT_EQ(f.cache().free_blocks(), free_before - 1);
  const auto q = f.random_queries(1, DType::kFloat32);
  for (int32_t layer = 0; layer < 2; ++layer) {
    for (SequenceId id : {a, *fork}) {
      const auto got = f.decode(layer, {id}, q, 0.125f);
      EXPECT_LE(compare(f.reference(layer, {id}, q, 0.125).out, got.out).max_abs, 2e-5) << "layer " << layer;
    }
  }
  EXPECT_EQ(f.cache().info(a)->layer_lengths, (std::vector<int32_t>{11, 6}));
  EXPECT_EQ(f.cache().info(*fork)->layer_lengths, (std::vector<int32_t>{14, 6}));
  ASSERT_TRUE(f.cache().free(*fork).ok());
  EXPECT_TRUE(f.cache().truncate(a, 0).ok());
  EXPECT_EQ(f.cache().info(a)->blocks_held, 0);
  EXPECT_EQ(f.cache().free_blocks(), 32);
  EXPECT_EQ(f.cache().truncate(a, -1).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(f.cache().truncate(424242, 1).status().code(), StatusCode::kNotFound);
}

// A reservation reading past a truncation point keeps its view: the next
// append into the cut block copies it instead of overwriting what it reads.
TEST(CacheManager, TruncationUnderAPinCopiesBeforeTheNextWrite) {
  CacheFixture f({bookkeeping_geometry(16), 1, 1});
  const SequenceId a = f.add_sequence(0, 7);
  const auto q = f.random_queries(1, DType::kFloat32);
  const auto before = f.decode(0, {a}, q, 0.125f);
  const Reservation pinned = f.pin(0, {a});
  ASSERT_TRUE(f.cache().truncate(a, 5).ok());
  const int32_t free_before = f.cache().free_blocks();
  f.append_random(a, 0, 2);  // positions 5, 6: inside what the pin reads
  EXPECT_EQ(f.cache().free_blocks(), free_before - 1) << "the pinned block was copied";
  DecodeLaunch launch;
  launch.tables = pinned.tables();
  launch.q = q.bytes.data();
  launch.scale = 0.125f;
  std::vector<uint8_t> out(before.out_bytes.size());
  DecodeOutputs o;
  o.out = out.data();
  ASSERT_TRUE(f.stream().decode(launch, o).ok());
  EXPECT_EQ(out, before.out_bytes) << "the pin saw the append after the truncation";
  const auto after = f.decode(0, {a}, q, 0.125f);
  EXPECT_LE(compare(f.reference(0, {a}, q, 0.125).out, after.out).max_abs, 2e-5);
}

TEST(CacheManager, ConcurrentAppendsOnDistinctSequences) {
  CacheFixture f({bookkeeping_geometry(512), 1, 1});
  constexpr int kThreads = 4;
  constexpr int kSteps = 100;
  std::vector<SequenceId> ids;
  for (int i = 0; i < kThreads; ++i) ids.push_back(f.cache().create("t"));
  std::vector<std::thread> workers;
  for (int i = 0; i < kThreads; ++i) {
    workers.emplace_back([&, i] {
      auto stream = f.backend().open_stream();
      ASSERT_TRUE(stream.ok());
      const auto k = rows(1, static_cast<float>(i));
      for (int s = 0; s < kSteps; ++s) {
        auto r = f.cache().append(**stream, ids[i], s % 2, 1, k.data(), k.data(), DType::kFloat32);
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

// Forks appended concurrently on two layers: both copy-on-write the same
// shared block index; the second waits for the first's copy, never reads it
// half-made, and every layer of both sequences matches the reference.
TEST(CacheManager, ConcurrentLayersCopyOnWriteTheSameBlockSafely) {
  CacheFixture f({bookkeeping_geometry(64), 1, 1});
  constexpr int kRounds = 40;
  for (int round = 0; round < kRounds; ++round) {
    const SequenceId a = f.cache().create("a");
    f.append_random(a, 0, 6);
    f.append_random(a, 1, 6);
    auto b = f.cache().fork(a);
    ASSERT_TRUE(b.ok());
    const std::vector<int32_t> table = f.cache().block_table(a);
    std::vector<std::thread> layers;
    for (int32_t layer = 0; layer < 2; ++layer) {
      layers.emplace_back([&, layer] {
        auto stream = f.backend().open_stream();
        ASSERT_TRUE(stream.ok());
        const auto k = rows(1, 7.f + layer);
        auto r = f.cache().append(**stream, a, layer, 1, k.data(), k.data(), DType::kFloat32);
        ASSERT_TRUE(r.ok()) << r.status().message();
      });
    }
    for (auto& t : layers) t.join();
    EXPECT_NE(f.cache().block_table(a), table) << "the shared last block was copied";
    f.follow_copies(a, table);
    for (int32_t layer = 0; layer < 2; ++layer) f.mirror(a, layer, 6, 1, rows(1, 7.f + layer), rows(1, 7.f + layer));
    const auto q = f.random_queries(1, DType::kFloat32);
    // The fork still sees the six shared tokens of each layer, a its seven.
    for (int32_t layer = 0; layer < 2; ++layer) {
      for (SequenceId id : {*b, a}) {
        const auto got = f.decode(layer, {id}, q, 0.125f);
        EXPECT_LE(compare(f.reference(layer, {id}, q, 0.125).out, got.out).max_abs, 2e-5)
            << "round " << round << " layer " << layer << (id == a ? " source" : " fork");
      }
    }
    EXPECT_EQ(f.cache().info(a)->layer_lengths, (std::vector<int32_t>{7, 7}));
    ASSERT_TRUE(f.cache().free(a).ok());
    ASSERT_TRUE(f.cache().free(*b).ok());
  }
  EXPECT_EQ(f.cache().free_blocks(), 64);
}

}  // namespace
}  // namespace pagoda::testing
