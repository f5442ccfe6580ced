// The decode plan both backends execute (pagoda/decode_plan.h): chunks per
// sequence, the partial layout, the items and which sequences share one.
#include <gtest/gtest.h>

#include <numeric>
#include <vector>

#include "pagoda/decode_plan.h"
#include "pagoda/softmax_state.h"

namespace pagoda {
namespace {

CacheGeometry geometry(int32_t block_size = 16) {
  CacheGeometry g;
  g.num_layers = 1;
  g.num_q_heads = 8;
  g.num_kv_heads = 2;
  g.head_dim = 64;
  g.block_size = block_size;
  g.num_blocks = 4096;
  return g;
}

// A batch whose sequence b holds tables[b] and attends lengths[b] tokens.
struct Batch {
  std::vector<std::vector<int32_t>> tables;
  std::vector<int32_t> lengths;
  std::vector<int32_t> q_indptr;  // empty: one row each
  std::vector<int32_t> indptr, ids;

  DecodeLaunch launch(int32_t split_tokens = 512) {
    indptr.assign(1, 0);
    ids.clear();
    for (const auto& t : tables) {
      ids.insert(ids.end(), t.begin(), t.end());
      indptr.push_back(static_cast<int32_t>(ids.size()));
    }
    DecodeLaunch l;
    l.tables = {static_cast<int32_t>(lengths.size()), indptr.data(), ids.data(), lengths.data()};
    l.q_indptr = q_indptr.empty() ? nullptr : q_indptr.data();
    l.scale = 0.125f;
    l.split_tokens = split_tokens;
    return l;
  }
};

// Blocks [first, first + n).
std::vector<int32_t> blocks(int32_t first, int32_t n) {
  std::vector<int32_t> b(static_cast<size_t>(n));
  std::iota(b.begin(), b.end(), first);
  return b;
}

// "seq:chunk,seq:chunk|..." of the items, members in order.
std::string describe(const DecodePlan& p) {
  std::string out;
  for (const PlanItem& item : p.items()) {
    if (!out.empty()) out += "|";
    for (int32_t m = item.first_member; m < item.end_member; ++m) {
      if (m > item.first_member) out += ",";
      out += std::to_string(p.members()[static_cast<size_t>(m)]) + ":" + std::to_string(item.chunk);
    }
  }
  return out;
}

TEST(DecodePlan, OneItemPerChunkSequenceMajorAndNoneForEmptySequences) {
  Batch batch;
  batch.lengths = {0, 1, 512, 513, 1000, 0};
  for (int32_t len : batch.lengths) batch.tables.push_back(blocks(static_cast<int32_t>(batch.tables.size()) * 100, (len + 15) / 16));
  DecodePlan plan;
  plan.build(batch.launch(), geometry(), {}, {});
  EXPECT_EQ(describe(plan), "1:0|2:0|3:0|3:1|4:0|4:1");
  EXPECT_EQ(plan.partial_rows(), 6 * 8);
  std::vector<int32_t> splits;
  std::vector<int64_t> first_partial;
  for (const PlanSequence& s : plan.sequences()) {
    splits.push_back(s.chunks.count());
    first_partial.push_back(s.first_partial);
  }
  EXPECT_EQ(splits, (std::vector<int32_t>{0, 1, 1, 2, 2, 0}));
  EXPECT_EQ(first_partial, (std::vector<int64_t>{0, 0, 8, 16, 32, 48}));
  EXPECT_EQ(plan.read_tokens(), 1 + 512 + 513 + 1000);
  EXPECT_EQ(plan.shared_tokens(), 0);
}

// Rows and windows: only the chunks some row attends get an item, each with a
// state per (row, query head) of its sequence, and a window's skipped chunks
// are not counted as read.
TEST(DecodePlan, ItemsCoverTheChunksTheRowsAttendWithAStatePerRowAndHead) {
  Batch batch;
  batch.lengths = {1100, 700};
  batch.tables = {blocks(0, 69), blocks(100, 44)};
  batch.q_indptr = {0, 5, 6};
  DecodeLaunch l = batch.launch();
  l.sliding_window = 100;  // rows of seq 0 at 1095..1099: keys 996..1099, chunks 1 and 2
  DecodePlan plan;
  plan.build(l, geometry(), {}, {});
  EXPECT_EQ(describe(plan), "0:1|0:2|1:1");  // seq 1: keys 600..699
  EXPECT_EQ(plan.partial_rows(), 2 * 5 * 8 + 1 * 8);
  EXPECT_EQ(plan.partial_index(0, 2, 3, 5), 5 * 8 + 3 * 8 + 5);
  EXPECT_EQ(plan.partial_index(1, 1, 0, 7), 80 + 7);
  EXPECT_EQ(plan.read_tokens(), (1100 - 996) + 100);
  EXPECT_EQ(plan.row_keys()[0].begin, 1095 - 99);
  EXPECT_EQ(plan.row_sequence()[5], 1);
}

TEST(DecodePlan, DeterministicChunksIgnoreTheWorkerCountFastChunksDoNot) {
  Batch batch;
  batch.lengths = {4000, 4000};
  batch.tables = {blocks(0, 1000), blocks(1000, 1000)};  // blocks of 4 tokens
  DecodeLaunch l = batch.launch(64);
  DecodePlan plan;
  plan.build(l, geometry(4), {}, {1});
  EXPECT_EQ(plan.chunk_tokens(), 64);
  plan.build(l, geometry(4), {}, {100000});
  EXPECT_EQ(plan.chunk_tokens(), 64);
  l.mode = SplitMode::kFast;
  plan.build(l, geometry(4), {}, {1});
  const int32_t few_workers = plan.chunk_tokens();
  plan.build(l, geometry(4), {}, {1000});
  EXPECT_GT(few_workers, plan.chunk_tokens());
  EXPECT_EQ(plan.chunk_tokens() % 4, 0);
}

// Forks of one 1100-token parent (blocks 0..68), each with a block of its own
// after token 1024: chunks 0 and 1 are whole and equal, chunk 2 is each one's.
TEST(DecodePlan, ForksShareTheirWholeEqualChunksOnce) {
  Batch batch;
  std::vector<int32_t> parent = blocks(0, 64);  // tokens 0..1023
  for (int f = 0; f < 3; ++f) {
    std::vector<int32_t> t = parent;
    for (int32_t b : blocks(1000 + 10 * f, 5)) t.push_back(b);  // 1024..1103
    batch.tables.push_back(t);
    batch.lengths.push_back(1100 + f);
  }
  DecodePlan plan;
  plan.build(batch.launch(), geometry(), {}, {});
  EXPECT_EQ(describe(plan), "0:0,1:0,2:0|0:1,1:1,2:1|0:2|1:2|2:2");
  // Each sequence still owns its states: chunk 0 of sequence 1 is its own.
  EXPECT_EQ(plan.partial_index(1, 0, 0, 0), 3 * 8);
  EXPECT_EQ(plan.read_tokens(), 1024 + 76 + 77 + 78);
  EXPECT_EQ(plan.shared_tokens(), 2 * 1024);

  plan.build(batch.launch(), geometry(), {}, {1, /*share_chunks=*/false});
  EXPECT_EQ(describe(plan), "0:0|0:1|0:2|1:0|1:1|1:2|2:0|2:1|2:2");
  EXPECT_EQ(plan.shared_tokens(), 0);
}

// Nothing changes where sharing cannot pay or would be wrong: a partly filled
// last chunk (even with equal blocks), one sequence alone, and chunks whose
// first block is equal but a later one differs (a fork that copied a block).
TEST(DecodePlan, PartialChunksLoneSequencesAndDivergedBlocksAreNotShared) {
  Batch batch;
  batch.tables = {blocks(0, 40), blocks(0, 40)};  // equal tables, 600 tokens: chunk 1 partial
  batch.lengths = {600, 600};
  DecodePlan plan;
  plan.build(batch.launch(), geometry(), {}, {});
  EXPECT_EQ(describe(plan), "0:0,1:0|0:1|1:1");

  Batch diverged;
  diverged.tables = {blocks(0, 32), blocks(0, 32)};
  diverged.tables[1][20] = 999;  // copied on write inside chunk 0
  diverged.lengths = {512, 512};
  plan.build(diverged.launch(), geometry(), {}, {});
  EXPECT_EQ(describe(plan), "0:0|1:0");

  // A backend may ask for bigger groups: two sequences then read their chunk each.
  plan.build(batch.launch(), geometry(), {}, {1, true, 3});
  EXPECT_EQ(describe(plan), "0:0|0:1|1:0|1:1");

  Batch alone;
  alone.tables = {blocks(0, 64)};
  alone.lengths = {1024};
  plan.build(alone.launch(), geometry(), {}, {});
  EXPECT_EQ(describe(plan), "0:0|0:1");
}

// The same sequence twice (pipelined steps in one batch) shares its whole
// chunks with itself: its blocks below both lengths cannot change.
TEST(DecodePlan, OneSequenceAtTwoLengthsSharesItsWholeChunks) {
  Batch batch;
  batch.tables = {blocks(0, 33), blocks(0, 33)};
  batch.lengths = {520, 521};
  DecodePlan plan;
  plan.build(batch.launch(), geometry(), {}, {});
  EXPECT_EQ(describe(plan), "0:0,1:0|0:1|1:1");
}

TEST(DecodePlan, ConstantsFoldTheScalesOnce) {
  Batch batch;
  batch.tables = {blocks(0, 1)};
  batch.lengths = {3};
  std::vector<float> sinks(8, 0.5f);
  DecodeLaunch l = batch.launch();
  l.sinks = sinks.data();
  DecodePlan plan;
  plan.build(l, geometry(), {2.f, 3.f}, {});
  EXPECT_FLOAT_EQ(plan.constants().q_scale, 0.125f * static_cast<float>(kLog2e) * 2.f);
  EXPECT_EQ(plan.constants().out_scale, 3.f);
  ASSERT_TRUE(plan.constants().has_sinks);
  EXPECT_EQ(plan.sinks_log2()[7], static_cast<float>(0.5f * kLog2e));
  l.soft_cap = 30.f;
  plan.build(l, geometry(), {2.f, 3.f}, {});
  EXPECT_EQ(plan.constants().q_scale, 0.125f * 2.f);
  EXPECT_EQ(plan.constants().inv_soft_cap, 1.f / 30.f);
  EXPECT_EQ(plan.constants().soft_cap_log2, 30.f * static_cast<float>(kLog2e));
}

}  // namespace
}  // namespace pagoda
