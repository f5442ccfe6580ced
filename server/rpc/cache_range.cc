#include "rpc/cache_range.h"

#include <cmath>
#include <cstddef>

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

// Every value of `wire` divided by 1 fits in `cache`: no scan needed.
bool always_fits(DType wire, DType cache) {
  return wire == cache || (wire == DType::kFloat16 && cache == DType::kBFloat16);
}

Status check_one(const char* field, const void* data, DType wire, int64_t elems, const CacheGeometry& g,
                 float scale, float limit) {
  constexpr int64_t kPiece = 256;
  float piece[kPiece];
  for (int64_t i = 0; i < elems; i += kPiece) {
    const int64_t m = elems - i < kPiece ? elems - i : kPiece;
    convert_to_float(static_cast<const std::byte*>(data) + i * static_cast<int64_t>(dtype_size(wire)), wire, piece,
                     m);
    for (int64_t j = 0; j < m; ++j) {
      // Divided as the backends store it (stored = x / scale).
      const float stored = scale == 1.f ? piece[j] : piece[j] / scale;
      if (std::fabs(stored) <= limit) continue;
      const int64_t at = i + j;
      const int64_t per_row = static_cast<int64_t>(g.num_kv_heads) * g.head_dim;
      const std::string scaled =
          scale == 1.f ? std::string() : fmt::format(" after division by the layer's {} scale {}", field, scale);
      return InvalidArgument("{}[{}]: expected values within the {} cache's range [-{}, {}]{}, received {} (row {}, "
                             "head {}, element {})",
                             field, at, dtype_name(g.dtype), limit, limit, scaled, piece[j], at / per_row,
                             at % per_row / g.head_dim, at % g.head_dim);
    }
  }
  return Status::Ok();
}

}  // namespace

Status check_cache_range(const void* k, const void* v, DType wire, int64_t rows, const CacheGeometry& g,
                         KvScale scale) {
  const float limit = largest_finite(g.dtype);
  if (limit == 0.f) return Status::Ok();
  if (always_fits(wire, g.dtype) && scale.k >= 1.f && scale.v >= 1.f) return Status::Ok();
  const int64_t elems = rows * g.num_kv_heads * g.head_dim;
  PAGODA_RETURN_IF_ERROR(check_one("k", k, wire, elems, g, scale.k, limit));
  return v == nullptr ? Status::Ok() : check_one("v", v, wire, elems, g, scale.v, limit);
}

}  // namespace pagoda
