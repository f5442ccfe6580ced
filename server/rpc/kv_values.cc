#include "rpc/kv_values.h"

#include <cmath>
#include <cstddef>
#include <string>

#include "pagoda/host_convert.h"

namespace pagoda {
namespace {

// The largest finite value of a 16-bit cache dtype; 0 when every finite
// input is stored as is (fp32) or saturated by design (fp8).
float largest_finite(DType cache) {
  switch (cache) {
    case DType::kFloat16: return 65504.f;
    case DType::kBFloat16: return 3.38953139e38f;  // 0x7F7F
    default: return 0.f;
  }
}

// Every finite value of `wire` divided by 1 fits in `cache`: no range to check.
bool always_fits(DType wire, DType cache) {
  return wire == cache || (wire == DType::kFloat16 && cache == DType::kBFloat16);
}

// Where element `at` of a [rows, num_kv_heads, head_dim] tensor lies.
std::string position(int64_t at, const CacheGeometry& g) {
  const int64_t per_row = static_cast<int64_t>(g.num_kv_heads) * g.head_dim;
  return fmt::format("row {}, head {}, element {}", at / per_row, at % per_row / g.head_dim, at % g.head_dim);
}

Status not_finite(const char* field, int64_t at, float value, const CacheGeometry& g) {
  return InvalidArgument("{}[{}]: expected finite values, received {} ({})", field, at, value, position(at, g));
}

// Finite values only: a test of the exponent bits, no conversion.
Status check_finite(const char* field, const void* data, DType wire, int64_t elems, const CacheGeometry& g) {
  const int64_t bad = first_non_finite(data, wire, elems);
  if (bad < 0) return Status::Ok();
  float value = 0;
  convert_to_float(static_cast<const std::byte*>(data) + bad * static_cast<int64_t>(dtype_size(wire)), wire, &value, 1);
  return not_finite(field, bad, value, g);
}

// Finite and within [-limit, limit] once divided by `scale`, in pieces small
// enough to stay in L1: each byte of the tensor is read from memory once.
Status check_finite_in_range(const char* field, const void* data, DType wire, int64_t elems, const CacheGeometry& g,
                             float scale, float limit) {
  constexpr int64_t kPiece = 256;
  float piece[kPiece];
  for (int64_t i = 0; i < elems; i += kPiece) {
    const int64_t m = elems - i < kPiece ? elems - i : kPiece;
    convert_to_float(static_cast<const std::byte*>(data) + i * static_cast<int64_t>(dtype_size(wire)), wire, piece,
                     m);
    for (int64_t j = 0; j < m; ++j) {
      // Divided as the backends store it (stored = x / scale); NaN fails the comparison too.
      const float stored = scale == 1.f ? piece[j] : piece[j] / scale;
      if (std::fabs(stored) <= limit) continue;
      const int64_t at = i + j;
      if (!std::isfinite(piece[j])) return not_finite(field, at, piece[j], g);
      const std::string scaled =
          scale == 1.f ? std::string() : fmt::format(" after division by the layer's {} scale {}", field, scale);
      return InvalidArgument("{}[{}]: expected values within the {} cache's range [-{}, {}]{}, received {} ({})", field,
                             at, dtype_name(g.dtype), limit, limit, scaled, piece[j], position(at, g));
    }
  }
  return Status::Ok();
}

Status check_one(const char* field, const void* data, DType wire, int64_t elems, const CacheGeometry& g, float scale) {
  const float limit = largest_finite(g.dtype);
  if (limit == 0.f || (always_fits(wire, g.dtype) && scale >= 1.f)) return check_finite(field, data, wire, elems, g);
  return check_finite_in_range(field, data, wire, elems, g, scale, limit);
}

}  // namespace

Status check_kv_values(const void* k, const void* v, DType wire, int64_t rows, const CacheGeometry& g, KvScale scale) {
  const int64_t elems = rows * g.num_kv_heads * g.head_dim;
  PAGODA_RETURN_IF_ERROR(check_one("k", k, wire, elems, g, scale.k));
  return v == nullptr ? Status::Ok() : check_one("v", v, wire, elems, g, scale.v);
}

}  // namespace pagoda
