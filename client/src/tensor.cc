#include "pagoda/client/tensor.h"

#include <bit>
#include <cstring>

#include <fmt/format.h>

#include "pagoda/host_convert.h"

namespace pagoda::client {

static_assert(std::endian::native == std::endian::little,
              "the wire format is little-endian and the client copies bytes as they are");

int64_t element_count(std::span<const int64_t> shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

std::string encode_values(std::span<const float> values, DType dtype) {
  std::string bytes(values.size() * dtype_size(dtype), '\0');
  convert_from_float(values.data(), bytes.data(), dtype, static_cast<int64_t>(values.size()));
  return bytes;
}

Result<std::vector<float>> decode_values(std::string_view bytes, DType dtype, int64_t count,
                                         std::string_view field) {
  const auto want = static_cast<size_t>(count) * dtype_size(dtype);
  if (count < 0 || bytes.size() != want) {
    return invalid_argument(fmt::format("{}.data: expected {} bytes ({} {} elements), received {}",
                                        field, want, count, dtype_name(dtype), bytes.size()));
  }
  std::vector<float> values(static_cast<size_t>(count));
  convert_to_float(bytes.data(), dtype, values.data(), count);
  return values;
}

std::vector<float> round_to_dtype(std::span<const float> values, DType dtype) {
  if (dtype == DType::kFloat32) return {values.begin(), values.end()};
  const std::string bytes = encode_values(values, dtype);
  std::vector<float> out(values.size());
  convert_to_float(bytes.data(), dtype, out.data(), static_cast<int64_t>(values.size()));
  return out;
}

int wire_dtype(DType dtype) { return static_cast<int>(dtype); }

Result<DType> dtype_from_wire(int number, std::string_view field) {
  switch (number) {
    case 1: return DType::kFloat32;
    case 2: return DType::kFloat16;
    case 3: return DType::kBFloat16;
    default: break;
  }
  return invalid_argument(
      fmt::format("{}.dtype: expected FLOAT32 (1), FLOAT16 (2) or BFLOAT16 (3), received {}",
                  field, number));
}

}  // namespace pagoda::client
