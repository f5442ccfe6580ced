// Which SIMD target the CPU kernels dispatch to, and the compute roof of the
// machine on that target.
#include <hwy/targets.h>

#include <algorithm>
#include <thread>
#include <vector>

#include "cpu/decode_cpu.h"

namespace pagoda::cpu {

double fma_peak_one_thread();  // decode_cpu.cc, per target

Status select_simd_target(const std::string& target) {
  // Targets better than AVX2 on x86 (AVX3_DL is not compiled in, see decode_cpu.cc).
  const int64_t above_avx2 = HWY_AVX3 | HWY_AVX3_DL;
  hwy::SetSupportedTargetsForTest(0);  // back to what the CPU has
  const int64_t supported = hwy::SupportedTargets();
  if (target == "best") return Status::Ok();
  if (target == "avx3") {
    if ((supported & HWY_AVX3) == 0) {
      return Status(StatusCode::kFailedPrecondition,
                    "target: expected a CPU with AVX-512 (F, VL, DQ, BW) for 'avx3', this CPU has none");
    }
    return Status::Ok();
  }
  if (target == "avx2") {
    if ((supported & HWY_AVX2) == 0) {
      return Status(StatusCode::kFailedPrecondition, "target: expected a CPU with AVX2 for 'avx2', this CPU has none");
    }
    hwy::SetSupportedTargetsForTest(supported & ~above_avx2);
    return Status::Ok();
  }
  return InvalidArgument("target: expected best, avx3 or avx2, received '{}'", target);
}

double measure_fma_peak(int32_t threads) {
  threads = std::max(1, threads);
  std::vector<double> rates(static_cast<size_t>(threads));
  // Best of three: a thread can lose its core for a moment on a shared machine.
  double best = 0;
  for (int rep = 0; rep < 3; ++rep) {
    std::vector<std::thread> pool;
    for (int32_t i = 0; i < threads; ++i) {
      pool.emplace_back([&rates, i] { rates[static_cast<size_t>(i)] = fma_peak_one_thread(); });
    }
    for (auto& t : pool) t.join();
    double total = 0;
    for (double r : rates) total += r;
    best = std::max(best, total);
  }
  return best;
}

}  // namespace pagoda::cpu
