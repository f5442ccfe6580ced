// The cut an export reads (CacheManager::cut) and the stored-rows import
// (CacheManager::import_rows), against the CPU backend's pools.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <thread>

#include "cache/cache_manager.h"
#include "unit/cache_fixture.h"

namespace pagoda::testing {
namespace {


// Rows whose every element is `value(t)` for token t = first + i.
std::vector<float> rows(const CacheGeometry& g, int32_t first, int32_t n, float base) {
  std::vector<float> out;
  for (int32_t t = first; t < first + n; ++t) out.insert(out.end(), static_cast<size_t>(g.head_dim), base + t);
  return out;
}

void append(CacheManager& cache, BackendStream& stream, SequenceId id, int32_t layer, int32_t first, int32_t n,
            float base) {
  const std::vector<float> k = rows(cache.geometry(), first, n, base);
  const std::vector<float> v = rows(cache.geometry(), first, n, -base);
  ASSERT_TRUE(cache.append(stream, id, layer, n, k.data(), v.data(), DType::kFloat32).ok());
}

// The first element of each K row the cut holds in `layer`, and of each V row.
std::pair<std::vector<float>, std::vector<float>> read(const SequenceCut& cut, BackendStream& stream, int32_t layer,
                                                       int32_t head_dim) {
  std::vector<int64_t> slots;
  cut.slots(0, cut.lengths[static_cast<size_t>(layer)], slots);
  std::vector<float> k(slots.size() * static_cast<size_t>(head_dim));
  std::vector<float> v(k.size());
  EXPECT_TRUE(stream.read_kv(layer, slots, k.data(), v.data()).ok());
  std::pair<std::vector<float>, std::vector<float>> firsts;
  for (size_t t = 0; t < slots.size(); ++t) {
    firsts.first.push_back(k[t * static_cast<size_t>(head_dim)]);
    firsts.second.push_back(v[t * static_cast<size_t>(head_dim)]);
  }
  return firsts;
}

TEST(SequenceCut, ReadsTheCutWhateverHappensAfter) {
  CacheFixture f({bookkeeping_geometry(32), 1, 1});
  CacheManager& cache = f.cache();
  const SequenceId id = cache.create("cut me");
  append(cache, f.stream(), id, 0, 0, 10, 100);
  append(cache, f.stream(), id, 1, 0, 7, 200);
  SequenceCut cut;
  ASSERT_TRUE(cache.cut(id, kDefaultTenant, cut).ok());
  EXPECT_EQ(cut.lengths, (std::vector<int32_t>{10, 7}));
  EXPECT_EQ(cut.label, "cut me");
  const int32_t free_at_cut = cache.free_blocks();

  // Truncate into the middle of a block and write there, append past the cut,
  // fork, free, and let new sequences take every free block.
  ASSERT_TRUE(cache.truncate(id, 5).ok());
  append(cache, f.stream(), id, 0, 5, 8, 900);
  append(cache, f.stream(), id, 1, 5, 3, 800);
  ASSERT_TRUE(cache.fork(id).ok());
  ASSERT_TRUE(cache.free(id).ok());
  while (cache.free_blocks() > 0) {
    const SequenceId other = cache.create("");
    append(cache, f.stream(), other, 0, 0, 4, 500);
  }
  const auto [k0, v0] = read(cut, f.stream(), 0, 64);
  const auto [k1, v1] = read(cut, f.stream(), 1, 64);
  for (int32_t t = 0; t < 10; ++t) {
    EXPECT_EQ(k0[static_cast<size_t>(t)], 100 + t);
    EXPECT_EQ(v0[static_cast<size_t>(t)], -100 + t);
  }
  for (int32_t t = 0; t < 7; ++t) EXPECT_EQ(k1[static_cast<size_t>(t)], 200 + t);
  cut.release();
  EXPECT_GE(cache.free_blocks(), 0);
  EXPECT_LE(free_at_cut, 32);
  // Another tenant's id is not found; an unknown one neither.
  SequenceCut other;
  const SequenceId mine = cache.create("");
  EXPECT_EQ(cache.cut(mine, TenantId{3}, other).code(), StatusCode::kNotFound);
  EXPECT_EQ(cache.cut(mine ^ 1, std::nullopt, other).code(), StatusCode::kNotFound);
}

TEST(SequenceCut, PinsHoldBlocksUntilReleased) {
  CacheFixture f({bookkeeping_geometry(8), 1, 1});
  CacheManager& cache = f.cache();
  const SequenceId id = cache.create("");
  append(cache, f.stream(), id, 0, 0, 8, 1);
  SequenceCut cut;
  ASSERT_TRUE(cache.cut(id, std::nullopt, cut).ok());
  ASSERT_TRUE(cache.free(id).ok());
  EXPECT_EQ(cache.free_blocks(), 6);
  cut.release();
  EXPECT_EQ(cache.free_blocks(), 8);
}

// Appends, truncations and frees on other threads while cuts are read: every
// cut is one consistent state. Token t of layer l written in generation g
// holds 1000 * g + t; a truncation starts a new generation, so along a cut's
// positions the generation never decreases.
TEST(SequenceCut, ConcurrentAppendsTruncationsAndFreesNeverTearACut) {
  CacheFixture f({bookkeeping_geometry(64), 1, 1});
  CacheManager& cache = f.cache();
  const SequenceId id = cache.create("");
  std::atomic<bool> stop{false};
  std::thread writer([&] {
    auto stream = f.backend().open_stream();
    ASSERT_TRUE(stream.ok());
    int32_t length = 0;
    int32_t generation = 1;
    for (int round = 0; !stop.load(); ++round) {
      if (length >= 40 || round % 7 == 6) {
        length = length / 3;
        ASSERT_TRUE(cache.truncate(id, length).ok());
        ++generation;
      }
      for (int32_t l = 0; l < 2; ++l) append(cache, **stream, id, l, length, 3, 1000.f * generation);
      length += 3;
    }
  });
  std::thread churn([&] {
    auto stream = f.backend().open_stream();
    ASSERT_TRUE(stream.ok());
    while (!stop.load()) {
      const SequenceId other = cache.create("");
      append(cache, **stream, other, 0, 0, 6, 5e6f);
      ASSERT_TRUE(cache.free(other).ok());
    }
  });
  auto stream = f.backend().open_stream();
  ASSERT_TRUE(stream.ok());
  for (int i = 0; i < 300; ++i) {
    SequenceCut cut;
    ASSERT_TRUE(cache.cut(id, std::nullopt, cut).ok());
    for (int32_t l = 0; l < 2; ++l) {
      const auto [k, v] = read(cut, **stream, l, 64);
      float last_generation = 0;
      for (size_t t = 0; t < k.size(); ++t) {
        const float generation = std::floor((k[t] - static_cast<float>(t)) / 1000.f);
        ASSERT_EQ(k[t], generation * 1000.f + static_cast<float>(t)) << "layer " << l << " token " << t;
        ASSERT_EQ(v[t], -generation * 1000.f + static_cast<float>(t));
        ASSERT_GE(generation, last_generation) << "layer " << l << " token " << t;
        last_generation = generation;
      }
    }
  }
  stop.store(true);
  writer.join();
  churn.join();
}

TEST(ImportRows, AllOrNothing) {
  CacheFixture f({bookkeeping_geometry(4), 1, 1});
  CacheManager& cache = f.cache();
  const CacheGeometry& g = cache.geometry();
  const std::vector<float> k = rows(g, 0, 12, 7);
  const std::vector<float> v = rows(g, 0, 12, -7);
  RawRows pieces[] = {{0, 8, k.data(), v.data()}, {0, 4, k.data() + 8 * 64, v.data() + 8 * 64},
                      {1, 12, k.data(), v.data()}};
  ImportRequest request;
  request.label = "in";
  request.rows = pieces;
  std::vector<int32_t> lengths;
  StatusOr<SequenceId> id = cache.import_rows(f.stream(), request, &lengths);
  ASSERT_TRUE(id.ok()) << id.status().message();
  EXPECT_EQ(lengths, (std::vector<int32_t>{12, 12}));
  EXPECT_EQ(cache.free_blocks(), 1);
  SequenceCut cut;
  ASSERT_TRUE(cache.cut(*id, kDefaultTenant, cut).ok());
  EXPECT_EQ(read(cut, f.stream(), 0, 64).first[11], 7 + 11);
  cut.release();
  // Two more blocks than are free: refused, nothing left behind.
  const size_t before = cache.num_sequences();
  StatusOr<SequenceId> refused = cache.import_rows(f.stream(), request);
  EXPECT_EQ(refused.status().code(), StatusCode::kResourceExhausted);
  EXPECT_EQ(cache.num_sequences(), before);
  EXPECT_EQ(cache.free_blocks(), 1);
  // A stage whose lengths do not match changes nothing.
  const int32_t expected[] = {12, 11};
  ImportRequest stage;
  stage.into = *id;
  stage.expected_lengths = expected;
  RawRows one[] = {{1, 1, k.data(), v.data()}};
  stage.rows = one;
  EXPECT_EQ(cache.import_rows(f.stream(), stage).status().code(), StatusCode::kFailedPrecondition);
  StatusOr<SequenceInfo> info = cache.info(*id);
  ASSERT_TRUE(info.ok());
  EXPECT_EQ(info->layer_lengths, (std::vector<int32_t>{12, 12}));
  // A restore with a taken id.
  ImportRequest again;
  again.restore_id = *id;
  EXPECT_EQ(cache.import_rows(f.stream(), again).status().code(), StatusCode::kAlreadyExists);
}

// A stage into a sequence whose partly filled last block a fork shares: the
// block is copied first, and the fork keeps what it had.
TEST(ImportRows, AStageCopiesASharedLastBlock) {
  CacheFixture f({bookkeeping_geometry(16), 1, 1});
  CacheManager& cache = f.cache();
  const CacheGeometry& g = cache.geometry();
  const SequenceId id = cache.create("");
  append(cache, f.stream(), id, 0, 0, 6, 100);
  append(cache, f.stream(), id, 1, 0, 6, 200);
  StatusOr<SequenceId> fork = cache.fork(id);
  ASSERT_TRUE(fork.ok());
  const std::vector<float> k = rows(g, 6, 3, 900);
  const std::vector<float> v = rows(g, 6, 3, -900);
  RawRows stage_rows[] = {{0, 3, k.data(), v.data()}, {1, 3, k.data(), v.data()}};
  const int32_t expected[] = {6, 6};
  ImportRequest stage;
  stage.into = id;
  stage.expected_lengths = expected;
  stage.rows = stage_rows;
  std::vector<int32_t> lengths;
  ASSERT_TRUE(cache.import_rows(f.stream(), stage, &lengths).ok());
  EXPECT_EQ(lengths, (std::vector<int32_t>{9, 9}));
  EXPECT_NE(cache.block_table(id)[1], cache.block_table(*fork)[1]);
  SequenceCut mine, theirs;
  ASSERT_TRUE(cache.cut(id, std::nullopt, mine).ok());
  ASSERT_TRUE(cache.cut(*fork, std::nullopt, theirs).ok());
  const auto [k_mine, v_mine] = read(mine, f.stream(), 1, 64);
  const auto [k_theirs, v_theirs] = read(theirs, f.stream(), 1, 64);
  ASSERT_EQ(k_mine.size(), 9u);
  ASSERT_EQ(k_theirs.size(), 6u);
  for (int32_t t = 0; t < 6; ++t) {
    EXPECT_EQ(k_mine[static_cast<size_t>(t)], 200 + t);
    EXPECT_EQ(k_theirs[static_cast<size_t>(t)], 200 + t);
  }
  for (int32_t t = 6; t < 9; ++t) EXPECT_EQ(k_mine[static_cast<size_t>(t)], 900 + t);
}

TEST(SequenceIds, ARestoredStateContinuesThePermutation) {
  SequenceIdGenerator first;
  std::vector<SequenceId> before;
  for (int i = 0; i < 5; ++i) before.push_back(first.next());
  SequenceIdGenerator second;  // another random key until restored
  second.restore(first.state());
  for (int i = 0; i < 100; ++i) {
    const SequenceId id = second.next();
    EXPECT_EQ(id, first.next());
    EXPECT_EQ(std::count(before.begin(), before.end(), id), 0);
  }
}

}  // namespace
}  // namespace pagoda::testing
