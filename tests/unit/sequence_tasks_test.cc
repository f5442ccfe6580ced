// Sequence tasks (pagoda/cpu_sequence_tasks.h): a sequence's chunks folded by
// one task give every row the bits a task per chunk and the merge after them
// give it, on every SIMD target and path (the FMAs, the bf16 dot products
// where the CPU has them), with sinks, soft-caps, windows, draft rows and
// latent attention; both are held to the reference too. The launch's own
// choice takes them for tasks of 16 rows and more only, and never for a
// chunk of several sub-blocks or a shared one.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <optional>
#include <string>
#include <vector>

#include "cpu/decode_cpu.h"
#include "pagoda/cpu_phase_clock.h"
#include "pagoda/cpu_sequence_tasks.h"
#include "pagoda/cpu_targets.h"
#include "reference/decode_table.h"
#include "unit/cache_fixture.h"
#include "unit/counted_decode.h"

namespace pagoda::testing {
namespace {

constexpr int32_t kSplit = static_cast<int32_t>(cpu::kSubBlockTokens);

struct SequenceCase {
  std::string target;
  DType dtype;
  int32_t gqa;
  int32_t head_dim;
  int32_t v_head_dim;  // 0: head_dim
  int32_t block_size;
  int32_t q_len;
  int32_t window;
  float soft_cap;
  bool sinks;
  int32_t threads;
};

::testing::Message describe(const SequenceCase& c) {
  ::testing::Message m;
  m << c.target << " " << dtype_name(c.dtype) << " gqa" << c.gqa << " d" << c.head_dim;
  if (c.v_head_dim > 0) m << "/" << c.v_head_dim;
  m << " bs" << c.block_size << " q_len " << c.q_len << " window " << c.window;
  if (c.soft_cap > 0) m << " soft-cap";
  if (c.sinks) m << " sinks";
  return m << " threads " << c.threads;
}

class SequenceTasks : public ::testing::Test {
 protected:
  void TearDown() override {
    cpu::force_sequence_tasks(std::nullopt);
    cpu::time_kernel_phases(false);
    EXPECT_TRUE(cpu::select_simd_target("best").ok());
  }
};

// Tasks one deterministic launch of `ids` runs with q_len query rows each.
int64_t tasks_of(CacheFixture& f, const std::vector<SequenceId>& ids, int32_t q_len, int32_t split = kSplit) {
  DecodeVariant variant;
  variant.q_lengths.assign(ids.size(), q_len);
  const auto q = f.random_queries(static_cast<int32_t>(ids.size()) * q_len, DType::kFloat32);
  return decode_counting(f, ids, q, 0.125f, variant, split).tasks;
}

// fp16, GQA 4 over two KV heads, head_dim 64, blocks of 16, for `tokens` in all.
CacheGeometry gqa4_geometry(int32_t tokens) {
  CacheGeometry g;
  g.num_layers = 1;
  g.num_kv_heads = 2;
  g.num_q_heads = 8;
  g.head_dim = 64;
  g.block_size = 16;
  g.dtype = DType::kFloat16;
  g.num_blocks = 2 * (tokens / 16 + 3);
  return g;
}

TEST_F(SequenceTasks, GiveTheBitsOfATaskPerChunk) {
  using enum DType;
  const SequenceCase cases[] = {
      {"best", kFloat16, 4, 128, 0, 16, 4, 0, 0.f, false, 2},
      {"best", kFloat16, 4, 128, 0, 16, 1, 0, 0.f, true, 1},
      {"best", kFloat16, 8, 64, 0, 7, 3, 700, 0.f, true, 2},
      {"best", kFloat32, 2, 64, 0, 16, 2, 0, 30.f, false, 1},
      {"best", kBFloat16, 4, 128, 0, 16, 4, 0, 0.f, true, 2},
      {"best", kFloat8E4M3, 4, 128, 0, 16, 4, 900, 0.f, false, 2},
      {"best", kFloat8E5M2, 8, 128, 0, 16, 1, 0, 20.f, true, 1},
      {"best", kBFloat16, 16, 576, 512, 16, 1, 0, 0.f, true, 2},
      {"avx3", kBFloat16, 4, 128, 0, 16, 4, 0, 0.f, true, 2},
      {"avx3", kFloat16, 4, 64, 0, 16, 4, 0, 0.f, false, 1},
      {"avx2", kFloat16, 4, 128, 0, 16, 4, 0, 0.f, true, 2},
      {"avx2", kFloat8E4M3, 8, 64, 0, 16, 2, 0, 0.f, false, 1},
  };
  for (const SequenceCase& c : cases) {
    SCOPED_TRACE(describe(c));
    const Status selected = cpu::select_simd_target(c.target);
    if (selected.code() == StatusCode::kFailedPrecondition) continue;  // this CPU lacks the target
    ASSERT_TRUE(selected.ok()) << selected.message();
    CacheGeometry g;
    g.num_layers = 1;
    g.num_kv_heads = c.v_head_dim > 0 ? 1 : 2;
    g.num_q_heads = g.num_kv_heads * c.gqa;
    g.head_dim = c.head_dim;
    g.v_head_dim = c.v_head_dim;
    g.block_size = c.block_size;
    g.dtype = c.dtype;
    // One chunk, two, three and four, the last ones partial.
    const std::vector<int32_t> lengths = {300, 1024, 1100, 1990};
    int32_t blocks = 0;
    for (int32_t n : lengths) blocks += (n + c.block_size - 1) / c.block_size + 1;
    g.num_blocks = blocks;
    FixtureOptions o{g, c.threads, 41};
    if (is_fp8(c.dtype)) o.kv_scales = {KvScale{0.5f, 0.25f}};
    CacheFixture f(o);
    const std::vector<SequenceId> ids = f.add_sequences(0, lengths);
    DecodeVariant variant;
    variant.q_lengths.assign(ids.size(), c.q_len);
    variant.window = c.window;
    variant.soft_cap = c.soft_cap;
    if (c.sinks) {
      for (int32_t h = 0; h < g.num_q_heads; ++h) variant.sinks.push_back(-1.f + 0.37f * static_cast<float>(h % 7));
    }
    const auto q = f.random_queries(static_cast<int32_t>(ids.size()) * c.q_len, DType::kFloat32);
    const float scale = 1.f / std::sqrt(static_cast<float>(c.head_dim));

    cpu::force_sequence_tasks(false);
    const CountedDecode per_chunk = decode_counting(f, ids, q, scale, variant, kSplit);
    cpu::force_sequence_tasks(true);
    const CountedDecode sequence = decode_counting(f, ids, q, scale, variant, kSplit);

    // The knob changed the tasks: the three sequences of several chunks run as
    // one task per head group instead of one per chunk.
    EXPECT_LT(sequence.tasks, per_chunk.tasks);
    ASSERT_EQ(sequence.decoded.out_bytes.size(), per_chunk.decoded.out_bytes.size());
    ASSERT_EQ(sequence.decoded.lse.size(), per_chunk.decoded.lse.size());
    EXPECT_EQ(std::memcmp(sequence.decoded.out_bytes.data(), per_chunk.decoded.out_bytes.data(),
                          sequence.decoded.out_bytes.size()),
              0);
    EXPECT_EQ(std::memcmp(sequence.decoded.lse.data(), per_chunk.decoded.lse.data(),
                          sequence.decoded.lse.size() * sizeof(float)),
              0);
    // The plan's split is reported as it was planned.
    EXPECT_EQ(sequence.decoded.splits, per_chunk.decoded.splits);

    const Arithmetic arithmetic = arithmetic_of("cpu", g);
    const auto want = f.reference(0, ids, as_multiplied(q, arithmetic), scale, variant);
    expect_matches_reference(sequence.decoded.out, sequence.decoded.lse, want, DType::kFloat32, arithmetic);
  }
}

// The launch's choice on one thread: tasks of 16 rows and more (GQA 4 with
// four query rows) fold their sequences; 4 rows (one query row) keep a task
// per chunk; a split of two sub-blocks a chunk never folds.
TEST_F(SequenceTasks, LaunchTakesThemForWideTasksOfOneSubBlockChunks) {
  CacheFixture f(FixtureOptions{gqa4_geometry(4096), 1, 5});
  const std::vector<SequenceId> ids = f.add_sequences(0, {2048, 2000});
  // Two sequences of four chunks, two KV heads.
  EXPECT_EQ(tasks_of(f, ids, 4), 2 * 2);
  EXPECT_EQ(tasks_of(f, ids, 1), 2 * 4 * 2);
  EXPECT_EQ(tasks_of(f, ids, 4, 2 * kSplit), 2 * 2 * 2);
}

// On two threads a sequence folds only where its reads are at most a balanced
// share of the launch's (the reads of all KV heads over four tasks a thread):
// of 4096, 1024 and 1024 tokens over two KV heads, the share is 1536 tokens,
// so the long sequence keeps its 8 chunks' tasks per KV head and the short
// ones fold into one each.
TEST_F(SequenceTasks, OnSeveralThreadsALongSequenceKeepsATaskPerChunk) {
  CacheFixture f(FixtureOptions{gqa4_geometry(6144), 2, 9});
  const std::vector<SequenceId> ids = f.add_sequences(0, {4096, 1024, 1024});
  EXPECT_EQ(tasks_of(f, ids, 4), 8 * 2 + 2 + 2);
}

}  // namespace
}  // namespace pagoda::testing
