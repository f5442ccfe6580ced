// How the CPU backend spreads a launch over its threads (kernels/cpu/cpu_launch.cc):
// a launch runs on the pool from 4096 (key, KV head) pairs, or from twice the
// multiply-adds of GQA 4 at head_dim 128 with one query row at that bound
// (2 x 4096 x 4 x 256); on the pool, a launch of fewer than two tasks a thread
// splits its groups' heads into halves of at least 8. Every row keeps the
// bits it has on one thread, and the reference's values.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "pagoda/cpu_phase_clock.h"
#include "pagoda/cpu_targets.h"
#include "reference/decode_table.h"
#include "unit/cache_fixture.h"
#include "unit/counted_decode.h"

namespace pagoda::testing {
namespace {

constexpr int32_t kSplit = 512;  // the default split: deterministic chunks of 512 keys

class LaunchThreads : public ::testing::Test {
 protected:
  void TearDown() override {
    cpu::time_kernel_phases(false);
    EXPECT_TRUE(cpu::select_simd_target("best").ok());
  }
};

// One KV head of `heads` query heads; latent attention (576 wide, V the first
// 512) unless head_dim is given.
CacheGeometry one_kv_head(int32_t heads, DType dtype, int32_t tokens, int32_t head_dim = 576,
                          int32_t v_head_dim = 512) {
  CacheGeometry g;
  g.num_layers = 1;
  g.num_kv_heads = 1;
  g.num_q_heads = heads;
  g.head_dim = head_dim;
  g.v_head_dim = v_head_dim;
  g.block_size = 16;
  g.dtype = dtype;
  g.num_blocks = tokens / 16 + 2;
  return g;
}

// Tasks of one launch of a sequence of `keys` keys (one query row) on 2 threads.
int64_t tasks_at(const CacheGeometry& g, int32_t keys) {
  CacheFixture f(FixtureOptions{g, 2, 3});
  const std::vector<SequenceId> ids = {f.add_sequence(0, keys)};
  const auto q = f.random_queries(1, DType::kFloat32);
  return decode_counting(f, ids, q, 0.125f, {}, kSplit).tasks;
}

// 16 latent heads: 16 x (576 + 512) multiply-adds a key reach 2 x 4096 x 4 x
// 256 at 482 keys (481 fall 15,360 short), far below 4096 keys. Below, the
// calling thread runs the one task; from there, the pool runs two of 8 heads.
TEST_F(LaunchThreads, SmallLaunchesStayOnTheCallingThreadUntilTheirMultiplyAddsReachTheBound) {
  const CacheGeometry g = one_kv_head(16, DType::kBFloat16, 512);
  EXPECT_EQ(tasks_at(g, 481), 1);
  EXPECT_EQ(tasks_at(g, 482), 2);
  // 8 heads are not split: 1000 keys of 8 latent heads reach the bound in
  // two chunks, and run as two tasks of all 8 heads.
  EXPECT_EQ(tasks_at(one_kv_head(8, DType::kBFloat16, 1024), 1000), 2);
}

struct SplitCase {
  std::string target;
  DType dtype;
  int32_t heads;
  int32_t head_dim;
  int32_t v_head_dim;
  int32_t keys;
  int32_t q_len;
  int32_t threads;
  bool variants;  // sinks and a soft-cap
  int64_t one_thread_tasks;  // a task a chunk, or one folding them (sequence tasks)
  int64_t tasks;             // on `threads` threads
};

::testing::Message describe(const SplitCase& c) {
  ::testing::Message m;
  m << c.target << " " << dtype_name(c.dtype) << " " << c.heads << " heads d" << c.head_dim << "/" << c.v_head_dim
    << " keys " << c.keys << " q_len " << c.q_len << " threads " << c.threads;
  if (c.variants) m << " sinks soft-cap";
  return m;
}

TEST_F(LaunchThreads, FewTasksSplitTheirHeadsWithTheBitsOfOneThread) {
  using enum DType;
  const SplitCase cases[] = {
      // 32 latent heads, one chunk: halves of 16, then quarters of 8.
      {"best", kBFloat16, 32, 576, 512, 300, 1, 2, false, 1, 4},
      // Two query rows of 32 heads: one task of both positions, then two and
      // four tasks of 16 and 8 heads with both positions each.
      {"best", kFloat8E4M3, 32, 576, 512, 300, 2, 2, true, 1, 4},
      // 4 threads: 128 heads into 8 tasks of 16.
      {"best", kBFloat16, 128, 576, 512, 100, 1, 4, false, 1, 8},
      // GQA 64 at head_dim 128, two chunks (one sequence task on one thread):
      // each chunk into halves of 32 heads.
      {"best", kFloat16, 64, 128, 0, 600, 1, 2, true, 1, 4},
      {"avx2", kBFloat16, 32, 576, 512, 300, 1, 2, false, 1, 4},
      {"avx2", kFloat8E5M2, 16, 576, 512, 500, 3, 2, false, 1, 2},
  };
  for (const SplitCase& c : cases) {
    SCOPED_TRACE(describe(c));
    const Status selected = cpu::select_simd_target(c.target);
    if (selected.code() == StatusCode::kFailedPrecondition) continue;  // this CPU lacks the target
    ASSERT_TRUE(selected.ok()) << selected.message();
    const CacheGeometry g = one_kv_head(c.heads, c.dtype, c.keys, c.head_dim, c.v_head_dim);
    DecodeVariant variant;
    variant.q_lengths = {c.q_len};
    if (c.variants) {
      variant.soft_cap = 25.f;
      for (int32_t h = 0; h < c.heads; ++h) variant.sinks.push_back(-0.5f + 0.29f * static_cast<float>(h % 5));
    }
    const float scale = 1.f / std::sqrt(static_cast<float>(c.head_dim));
    // The same seed fills both caches and draws both queries alike.
    CountedDecode runs[2];
    CacheFixture::Queries q;
    std::vector<SequenceId> ids;
    for (int i = 0; i < 2; ++i) {
      FixtureOptions o{g, i == 0 ? 1 : c.threads, 17};
      if (is_fp8(c.dtype)) o.kv_scales = {KvScale{0.5f, 0.25f}};
      CacheFixture f(o);
      ids = {f.add_sequence(0, c.keys)};
      q = f.random_queries(c.q_len, DType::kFloat32);
      runs[i] = decode_counting(f, ids, q, scale, variant, kSplit);
      if (i == 1) {
        const Arithmetic arithmetic = arithmetic_of("cpu", g);
        const auto want = f.reference(0, ids, as_multiplied(q, arithmetic), scale, variant);
        expect_matches_reference(runs[i].decoded.out, runs[i].decoded.lse, want, DType::kFloat32, arithmetic);
      }
    }
    EXPECT_EQ(runs[0].tasks, c.one_thread_tasks);
    EXPECT_EQ(runs[1].tasks, c.tasks);
    ASSERT_EQ(runs[0].decoded.out_bytes.size(), runs[1].decoded.out_bytes.size());
    EXPECT_EQ(std::memcmp(runs[0].decoded.out_bytes.data(), runs[1].decoded.out_bytes.data(),
                          runs[0].decoded.out_bytes.size()),
              0)
        << "splitting the heads changed the bits";
    ASSERT_EQ(runs[0].decoded.lse.size(), runs[1].decoded.lse.size());
    EXPECT_EQ(std::memcmp(runs[0].decoded.lse.data(), runs[1].decoded.lse.data(),
                          runs[0].decoded.lse.size() * sizeof(float)),
              0);
  }
}

}  // namespace
}  // namespace pagoda::testing
