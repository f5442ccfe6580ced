// The attention variants of docs/design.md §9 on the CUDA backend (unit/variant_checks.h):
// the same table and bitwise draft-row promise as the CPU backend's.
#include <gtest/gtest.h>

#include "cuda/skip_without_device.h"
#include "unit/variant_checks.h"

namespace pagoda::testing {
namespace {

class CudaVariants : public ::testing::TestWithParam<VariantCase> {};

TEST_P(CudaVariants, MatchReference) {
  PAGODA_SKIP_WITHOUT_CUDA_DEVICE();
  expect_variants_match_reference("cuda", GetParam());
}

INSTANTIATE_TEST_SUITE_P(Table, CudaVariants, ::testing::ValuesIn(variant_table()),
                         [](const ::testing::TestParamInfo<VariantCase>& info) { return to_string(info.param); });

TEST(CudaVariants, EmptySequenceWithASinkGivesZeroAndTheSink) {
  PAGODA_SKIP_WITHOUT_CUDA_DEVICE();
  expect_empty_sequence_gives_zero_and_the_sink("cuda");
}

TEST(CudaVariants, ChunksOutsideTheWindowAreNotLaunched) {
  PAGODA_SKIP_WITHOUT_CUDA_DEVICE();
  expect_chunks_outside_the_window_not_launched("cuda");
}

TEST(CudaVariants, EachDraftRowHasTheBitsOfItsSingleStepDecode) {
  PAGODA_SKIP_WITHOUT_CUDA_DEVICE();
  expect_draft_rows_have_single_step_bits("cuda", 1);
}

}  // namespace
}  // namespace pagoda::testing
