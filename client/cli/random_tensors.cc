#include "random_tensors.h"

#include <cstring>
#include <fstream>
#include <iterator>

#include <fmt/format.h>

namespace pagoda::client {

std::vector<float> RandomTensors::normal(int64_t count) {
  std::normal_distribution<float> dist(0.f, 1.f);
  std::vector<float> values(static_cast<size_t>(count));
  for (float& x : values) x = dist(engine_);
  return values;
}

Result<std::vector<float>> read_float_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return invalid_argument(fmt::format("{}: cannot open for reading", path));
  const std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (bytes.size() % sizeof(float) != 0) {
    return invalid_argument(fmt::format("{}: expected a multiple of 4 bytes (raw fp32), received {}",
                                        path, bytes.size()));
  }
  std::vector<float> values(bytes.size() / sizeof(float));
  std::memcpy(values.data(), bytes.data(), bytes.size());  // little-endian host (checked in tensor.cc)
  return values;
}

}  // namespace pagoda::client
