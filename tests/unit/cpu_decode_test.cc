// The CPU backend against the double-precision reference over a declared table.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <tuple>

#include "cpu/cpu_backend.h"
#include "cpu/decode_cpu.h"
#include "pagoda/backend_factory.h"
#include "reference/decode_table.h"
#include "unit/cache_fixture.h"

namespace pagoda::testing {
namespace {

using Case = DecodeCase;
constexpr auto& kLengths = kTableLengths;
constexpr int32_t kLayer = kTableLayer;

// One case of the table: a batch of kTableLengths sequences against the
// reference, in chunks of split_tokens.
void run_table_case(const Case& c, int32_t split_tokens = kTableSplitTokens) {
  const CacheGeometry g = table_geometry(c);
  CacheFixture f({g, 2, 1234});

  const int32_t batch = static_cast<int32_t>(std::size(kLengths));
  const auto q = f.random_queries(batch, c.q);
  // The last token carries the row max of each group's first head.
  const std::vector<SequenceId> ids =
      f.add_sequences(kLayer, std::vector<int32_t>(std::begin(kLengths), std::end(kLengths)), &q);
  const float scale = 1.f / std::sqrt(static_cast<float>(c.head_dim));
  const auto got = f.decode(kLayer, ids, q, scale, SplitMode::kDeterministic, split_tokens);
  const Arithmetic arithmetic = arithmetic_of("cpu", g);
  const auto want = f.reference(kLayer, ids, as_multiplied(q, arithmetic), scale);

  EXPECT_EQ(got.chunk_tokens, split_tokens);
  expect_table_decode(g, got, want, c.q, arithmetic);
}

class CpuDecode : public ::testing::TestWithParam<Case> {};

TEST_P(CpuDecode, MatchesReference) { run_table_case(GetParam()); }

INSTANTIATE_TEST_SUITE_P(Table, CpuDecode, ::testing::ValuesIn(decode_table()), case_name);

// Groups of 9 to 15, which AVX-512 scores four rows to a vector and AVX2 two
// (quad scores): GQA 9's last row block holds one padding row on AVX2 and
// three on AVX-512, GQA 10's two on AVX-512, GQA 12 is whole blocks on both,
// and on AVX2 groups of 5 and 6 blocks end in calls of one and two blocks.
// fp32 and fp16 caches are read in place; e4m3 goes wherever best sends it
// (the tile on the FMAs, or the dot products).
std::vector<Case> quad_group_table() {
  std::vector<Case> cases;
  for (int32_t d : {64, 128})
    for (int32_t gqa : {9, 10, 12})
      for (int32_t bs : {3, 16})
        for (DType cache : {DType::kFloat32, DType::kFloat16, DType::kFloat8E4M3})
          cases.push_back({d, gqa, bs, cache, DType::kFloat32});
  return cases;
}

class CpuDecodeQuadGroups : public ::testing::TestWithParam<Case> {};

TEST_P(CpuDecodeQuadGroups, MatchesReference) { run_table_case(GetParam()); }

INSTANTIATE_TEST_SUITE_P(Table, CpuDecodeQuadGroups, ::testing::ValuesIn(quad_group_table()), case_name);

// The same kernel compiled for AVX2, dispatched on purpose where the CPU has
// better (AVX-512 machines otherwise never run it): every head_dim and group
// size, two block sizes, every cache dtype, q in fp32.
class CpuDecodeAvx2 : public ::testing::TestWithParam<Case> {
 protected:
  void SetUp() override {
    const Status s = cpu::select_simd_target("avx2");
    if (s.code() == StatusCode::kFailedPrecondition) GTEST_SKIP() << s.message();
    ASSERT_TRUE(s.ok()) << s.message();
    ASSERT_STREQ(cpu::simd_target_name(), "AVX2");
  }
  void TearDown() override { EXPECT_TRUE(cpu::select_simd_target("best").ok()); }
};

TEST_P(CpuDecodeAvx2, MatchesReference) { run_table_case(GetParam()); }

std::vector<Case> avx2_table() {
  std::vector<Case> cases;
  for (const Case& c : decode_table())
    if ((c.block_size == 3 || c.block_size == 16) && c.q == DType::kFloat32) cases.push_back(c);
  return cases;
}

INSTANTIATE_TEST_SUITE_P(Table, CpuDecodeAvx2, ::testing::ValuesIn(avx2_table()), case_name);

// Chunks of two of the kernel's sub-blocks, where the table's split makes a
// chunk one: the long sequences merge the sub-blocks of each chunk before the
// chunks. Every cache dtype and group at head_dim 128 and latent attention
// with 16 heads, 16-token blocks, q in fp32, on the best target and on AVX2.
constexpr int32_t kSubBlockSplit = 2 * cpu::kSubBlockTokens;
static_assert(kSubBlockSplit < kTableLengths[std::size(kTableLengths) - 1], "the longest sequence spans chunks");

std::vector<Case> sub_block_table() {
  std::vector<Case> cases;
  for (const Case& c : decode_table()) {
    const bool shape = c.v_head_dim == 0 ? c.head_dim == 128 : c.gqa == 16;
    if (shape && c.block_size == 16 && c.q == DType::kFloat32) cases.push_back(c);
  }
  return cases;
}

class CpuDecodeSubBlocks : public ::testing::TestWithParam<Case> {};
class CpuDecodeSubBlocksAvx2 : public CpuDecodeAvx2 {};

TEST_P(CpuDecodeSubBlocks, MatchesReference) { run_table_case(GetParam(), kSubBlockSplit); }
TEST_P(CpuDecodeSubBlocksAvx2, MatchesReference) { run_table_case(GetParam(), kSubBlockSplit); }

INSTANTIATE_TEST_SUITE_P(Table, CpuDecodeSubBlocks, ::testing::ValuesIn(sub_block_table()), case_name);
INSTANTIATE_TEST_SUITE_P(Table, CpuDecodeSubBlocksAvx2, ::testing::ValuesIn(sub_block_table()), case_name);

// A matrix unit forced on the bf16 cases best leaves to the FMAs (GQA 1 and
// 4): the unit with 1 to 4 rows of 16, short runs (block sizes 1, 3, 7) and
// every head_dim, within the bf16 bound. Skipped where the CPU lacks the unit.
template <const char* kTarget>
class CpuDecodeForcedUnit : public ::testing::TestWithParam<Case> {
 protected:
  void SetUp() override {
    const Status s = cpu::select_simd_target(kTarget);
    if (s.code() == StatusCode::kFailedPrecondition) GTEST_SKIP() << s.message();
    ASSERT_TRUE(s.ok()) << s.message();
    ASSERT_EQ(arithmetic_of("cpu", table_geometry(GetParam())), Arithmetic::kBf16Tiles);
  }
  void TearDown() override { EXPECT_TRUE(cpu::select_simd_target("best").ok()); }
};

constexpr char kAmxTarget[] = "amx";
constexpr char kAvx512Bf16Target[] = "avx512bf16";
class CpuDecodeAmx : public CpuDecodeForcedUnit<kAmxTarget> {};
class CpuDecodeAvx512Bf16 : public CpuDecodeForcedUnit<kAvx512Bf16Target> {};

TEST_P(CpuDecodeAmx, MatchesReference) { run_table_case(GetParam()); }
TEST_P(CpuDecodeAvx512Bf16, MatchesReference) { run_table_case(GetParam()); }

std::vector<Case> unit_forced_table() {
  std::vector<Case> cases;
  for (const Case& c : decode_table())
    if (c.cache == DType::kBFloat16 && c.gqa < 8 && c.v_head_dim == 0) cases.push_back(c);
  return cases;
}

INSTANTIATE_TEST_SUITE_P(Table, CpuDecodeAmx, ::testing::ValuesIn(unit_forced_table()), case_name);
INSTANTIATE_TEST_SUITE_P(Table, CpuDecodeAvx512Bf16, ::testing::ValuesIn(unit_forced_table()), case_name);

TEST(CpuDecodeFastMode, MatchesReference) {
  CacheGeometry g;
  g.num_layers = 1;
  g.num_kv_heads = 2;
  g.num_q_heads = 8;
  g.head_dim = 128;
  g.block_size = 16;
  g.dtype = DType::kFloat16;
  g.num_blocks = 600;
  CacheFixture f({g, 2, 99});
  const std::vector<SequenceId> ids = {f.add_sequence(0, 3000), f.add_sequence(0, 5), f.add_sequence(0, 1200)};
  const auto q = f.random_queries(3, DType::kFloat32);
  const auto got = f.decode(0, ids, q, 0.0883883f, SplitMode::kFast, 512);
  const auto want = f.reference(0, ids, q, 0.0883883);
  const ErrorStats e = compare(want.out, got.out);
  EXPECT_FALSE(e.has_nan);
  EXPECT_LE(e.max_abs, 2e-5);
  EXPECT_EQ(got.chunk_tokens % 16, 0);
  EXPECT_EQ(got.splits[0], (3000 + got.chunk_tokens - 1) / got.chunk_tokens);
}

TEST(CpuBackend, RejectsUnsupportedGeometry) {
  BackendOptions o;
  o.kind = "cpu";
  o.geometry.num_blocks = 4;
  o.geometry.head_dim = 96;
  auto b = make_backend(o);
  ASSERT_FALSE(b.ok());
  EXPECT_EQ(b.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(b.status().message().find("head_dim"), std::string::npos);
  EXPECT_NE(b.status().message().find("96"), std::string::npos);
  o.geometry.head_dim = 64;
  o.geometry.num_q_heads = 3;
  o.geometry.num_kv_heads = 2;
  EXPECT_EQ(make_backend(o).status().code(), StatusCode::kInvalidArgument);
}

// The factory's choice through its seam (pagoda/backend_factory.h), in every
// build: a set of makers without CUDA behaves as a CUDA-less binary does.
bool no_device() { return false; }
bool a_device() { return true; }
StatusOr<std::unique_ptr<Backend>> fake_cuda(const BackendOptions&) {
  return Status(StatusCode::kUnavailable, "fake cuda maker called");
}

TEST(BackendFactory, WithoutCudaCudaSaysSoAndAutoIsTheCpu) {
  BackendOptions o;
  o.geometry.num_blocks = 4;
  BackendMakers without_cuda;
  without_cuda.cpu = &make_cpu_backend;
  o.kind = "cuda";
  auto b = make_backend_with(o, without_cuda);
  ASSERT_FALSE(b.ok());
  EXPECT_EQ(b.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(b.status().message().find("built without CUDA"), std::string::npos) << b.status().message();
  o.kind = "auto";
  auto cpu = make_backend_with(o, without_cuda);
  ASSERT_TRUE(cpu.ok()) << cpu.status().message();
  EXPECT_EQ(cpu.value()->name(), "cpu");
}

TEST(BackendFactory, AutoPicksCudaOnlyWhenADeviceAnswers) {
  BackendOptions o;
  o.geometry.num_blocks = 4;
  o.kind = "auto";
  BackendMakers with_cuda{&make_cpu_backend, &fake_cuda, &no_device};
  auto b = make_backend_with(o, with_cuda);
  ASSERT_TRUE(b.ok()) << b.status().message();
  EXPECT_EQ(b.value()->name(), "cpu");
  with_cuda.cuda_device_available = &a_device;
  EXPECT_EQ(make_backend_with(o, with_cuda).status().message(), "fake cuda maker called");
}

TEST(BackendFactory, UnknownKindIsInvalidArgumentNamingIt) {
  BackendOptions o;
  o.geometry.num_blocks = 4;
  o.kind = "tpu";
  auto b = make_backend(o);
  ASSERT_FALSE(b.ok());
  EXPECT_EQ(b.status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(b.status().message(), "backend: expected auto, cpu or cuda, received 'tpu'");
}

}  // namespace
}  // namespace pagoda::testing
