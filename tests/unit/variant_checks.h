#pragma once
// The attention variants of docs/design.md §9 checked on one backend, against the
// reference: several query rows per sequence (bottom-right causal), sliding
// windows, logit soft-caps and per-head sinks, over a declared table; and the
// bitwise promise: row i of a multi-row decode has the bits of a single-row
// decode of the same sequence at length L - n + i + 1, alone or in a batch.
// Each backend's test binary runs them (unit/variants_test.cc: CPU;
// cuda/cuda_variants_test.cc: CUDA).

#include <cstdint>
#include <string>
#include <vector>

#include "pagoda/dtype.h"
#include "pagoda/split_plan.h"

namespace pagoda::testing {

struct VariantCase {
  int32_t block_size;
  int32_t gqa;
  DType cache;
};
std::string to_string(const VariantCase& c);
void PrintTo(const VariantCase& c, std::ostream* os);

// block size {1, 16} x group {1, 4} x every cache dtype (fp32, fp16, bf16, fp8 e4m3 and e5m2).
std::vector<VariantCase> variant_table();

// q_len {1, 2, 5, 16} x window {0, 1, 17, 600} x soft-cap {0, 30} x sinks
// {off, on}, each over every sequence long enough for its rows. Fast mode
// takes q_len {3, 16}: tasks of 12 and more rows, which it may score in an
// order of their own (docs/design.md §2).
void expect_variants_match_reference(const std::string& backend, const VariantCase& c,
                                     SplitMode mode = SplitMode::kDeterministic);

// An empty sequence with a sink: output 0, LSE = the sink, no chunk launched.
void expect_empty_sequence_gives_zero_and_the_sink(const std::string& backend);

// Chunks outside every row's window are neither launched nor read.
void expect_chunks_outside_the_window_not_launched(const std::string& backend);

// Each draft row equals, byte for byte, a single-row decode of a fork
// truncated to its position, for every variant, the multi-row decode in a batch
// (block size, group and cache from c: by default bf16 at GQA 4).
void expect_draft_rows_have_single_step_bits(const std::string& backend, int32_t threads,
                                             const VariantCase& c = {16, 4, DType::kBFloat16});

}  // namespace pagoda::testing
