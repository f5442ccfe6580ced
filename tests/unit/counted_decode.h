#pragma once
// A deterministic decode through a CacheFixture with the CPU phase clock on,
// for the tests that check how a launch cut its work: the decode and the
// number of tasks it ran.

#include <cstdint>
#include <vector>

#include "pagoda/cpu_phase_clock.h"
#include "unit/cache_fixture.h"

namespace pagoda::testing {

struct CountedDecode {
  CacheFixture::Decoded decoded;
  int64_t tasks = 0;  // tasks the launch ran, by the phase clock
};

inline CountedDecode decode_counting(CacheFixture& f, const std::vector<SequenceId>& ids,
                                     const CacheFixture::Queries& q, float scale, const DecodeVariant& variant,
                                     int32_t split_tokens) {
  cpu::time_kernel_phases(true);
  CountedDecode r;
  r.decoded = f.decode(0, ids, q, scale, SplitMode::kDeterministic, split_tokens, variant);
  r.tasks = cpu::kernel_phase_times().tasks;
  cpu::time_kernel_phases(false);
  return r;
}

}  // namespace pagoda::testing
