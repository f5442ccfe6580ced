#pragma once
// Inputs for the CLI and the benchmark: seeded random values (reproducible runs)
// and raw little-endian fp32 files.

#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "pagoda/client/error.h"

namespace pagoda::client {

// Draws standard-normal fp32 values from one seeded generator.
class RandomTensors {
 public:
  explicit RandomTensors(uint64_t seed) : engine_(seed) {}
  std::vector<float> normal(int64_t count);

 private:
  std::mt19937_64 engine_;
};

// The whole file as fp32 values (raw little-endian, no header). Fails when the
// file cannot be read or its size is not a multiple of 4 bytes.
Result<std::vector<float>> read_float_file(const std::string& path);

}  // namespace pagoda::client
