#pragma once
// `pagoda-bench kernel`: the backend's decode timed in process on a named shape,
// as ratios measured in the same run: K/V bytes read per second over the
// machine's memory bandwidth (CPU: streaming read; CUDA: device-to-device copy),
// deterministic vs fast mode, and the speed-up over a naive path that
// materialises the scores (CPU only).

#include <CLI/CLI.hpp>

namespace pagoda::bench {

void add_kernel_command(CLI::App& app);

}  // namespace pagoda::bench
