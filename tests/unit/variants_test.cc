// The attention variants of docs/design.md §9 on the CPU backend (unit/variant_checks.h),
// the bitwise draft-row promise on one and two threads.
#include <gtest/gtest.h>

#include "unit/variant_checks.h"

namespace pagoda::testing {
namespace {

class Variants : public ::testing::TestWithParam<VariantCase> {};

TEST_P(Variants, MatchReference) { expect_variants_match_reference("cpu", GetParam()); }

INSTANTIATE_TEST_SUITE_P(Table, Variants, ::testing::ValuesIn(variant_table()),
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

}  // namespace
}  // namespace pagoda::testing
