// The attention variants of docs/design.md §9 on the CPU backend (unit/variant_checks.h),
// the bitwise draft-row promise on one and two threads.
#include <gtest/gtest.h>

#include "pagoda/cpu_targets.h"
#include "pagoda/status.h"
#include "unit/variant_checks.h"

namespace pagoda::testing {
namespace {

class Variants : public ::testing::TestWithParam<VariantCase> {};

TEST_P(Variants, MatchReference) { expect_variants_match_reference("cpu", GetParam()); }

INSTANTIATE_TEST_SUITE_P(Table, Variants, ::testing::ValuesIn(variant_table()),
                         [](const ::testing::TestParamInfo<VariantCase>& info) { return to_string(info.param); });

// Fast mode scores tasks of many rows in an order of its own (quad scores on
// AVX-512 whatever the group): on the best target and on the AVX-512 FMAs,
// where bf16 and fp8 caches reach them too.
class FastVariants : public ::testing::TestWithParam<VariantCase> {
 protected:
  void TearDown() override { EXPECT_TRUE(cpu::select_simd_target("best").ok()); }
};

TEST_P(FastVariants, MatchReference) {
  for (const char* target : {"best", "avx3"}) {
    SCOPED_TRACE(target);
    const Status s = cpu::select_simd_target(target);
    if (s.code() == StatusCode::kFailedPrecondition) continue;  // no AVX-512 here: best covered it
    ASSERT_TRUE(s.ok()) << s.message();
    expect_variants_match_reference("cpu", GetParam(), SplitMode::kFast);
  }
}

INSTANTIATE_TEST_SUITE_P(Table, FastVariants, ::testing::ValuesIn(variant_table()),
                         [](const ::testing::TestParamInfo<VariantCase>& info) { return to_string(info.param); });

TEST(Variants, EmptySequenceWithASinkGivesZeroAndTheSink) { expect_empty_sequence_gives_zero_and_the_sink("cpu"); }

TEST(Variants, ChunksOutsideTheWindowAreNotLaunched) { expect_chunks_outside_the_window_not_launched("cpu"); }

// bf16 at GQA 4 (AVX512-BF16's dot products where the CPU has them), and fp16
// at GQA 8: on AVX-512 its scores take four rows to a vector (quad scores),
// the draft rows of 5 positions 10 row blocks of them.
TEST(Variants, EachDraftRowHasTheBitsOfItsSingleStepDecode) {
  for (int32_t threads : {1, 2}) {
    expect_draft_rows_have_single_step_bits("cpu", threads);
    expect_draft_rows_have_single_step_bits("cpu", threads, {16, 8, DType::kFloat16});
  }
}

// bf16 on the AVX-512 FMAs reads two vectors at once in a paired lane order:
// a single-step decode (4 rows, read in place) and draft rows of 5 positions
// (20 rows, from an fp32 tile) must still give each row the same bits.
TEST(Variants, EachDraftRowOfBf16OnTheAvx512FmasHasTheBitsOfItsSingleStepDecode) {
  const Status s = cpu::select_simd_target("avx3");
  if (s.code() == StatusCode::kFailedPrecondition) GTEST_SKIP() << "no AVX-512 here: " << s.message();
  ASSERT_TRUE(s.ok()) << s.message();
  for (int32_t threads : {1, 2}) {
    expect_draft_rows_have_single_step_bits("cpu", threads);
    expect_draft_rows_have_single_step_bits("cpu", threads, {16, 8, DType::kBFloat16});
  }
  EXPECT_TRUE(cpu::select_simd_target("best").ok());
}

}  // namespace
}  // namespace pagoda::testing
