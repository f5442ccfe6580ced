#pragma once
// Element types of the cache and of tensors on the wire. The numbers match the
// wire contract's DType enum (pagoda.v1.DType).

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string_view>

#include "pagoda/hd.h"

namespace pagoda {

// The fp8 types (OCP FP8: e4m3 with bias 7, no infinities and max 448; e5m2
// with bias 15 and max finite 57344) are cache dtypes only: tensors on the
// wire are fp32, fp16 or bf16 (DESIGN §9).
enum class DType : uint8_t { kFloat32 = 1, kFloat16 = 2, kBFloat16 = 3, kFloat8E4M3 = 4, kFloat8E5M2 = 5 };

HD size_t dtype_size(DType t) {
  return t == DType::kFloat32 ? 4 : (t == DType::kFloat8E4M3 || t == DType::kFloat8E5M2) ? 1 : 2;
}

HD bool is_fp8(DType t) { return t == DType::kFloat8E4M3 || t == DType::kFloat8E5M2; }

// Whether `t` is one of the enumerators (a value read from the wire may not be).
HD bool known_dtype(DType t) {
  return t == DType::kFloat32 || t == DType::kFloat16 || t == DType::kBFloat16 || is_fp8(t);
}

// The dtypes a tensor on the wire may have (and a client's values be sent as).
HD bool tensor_dtype(DType t) { return t == DType::kFloat32 || t == DType::kFloat16 || t == DType::kBFloat16; }

inline std::string_view dtype_name(DType t) {
  switch (t) {
    case DType::kFloat32: return "fp32";
    case DType::kFloat16: return "fp16";
    case DType::kBFloat16: return "bf16";
    case DType::kFloat8E4M3: return "fp8_e4m3";
    case DType::kFloat8E5M2: return "fp8_e5m2";
  }
  return "unknown";
}

// Accepts the flag spellings fp32/fp16/bf16/fp8_e4m3/fp8_e5m2 (and
// float32/float16/bfloat16/float8_e4m3/float8_e5m2).
inline std::optional<DType> parse_dtype(std::string_view s) {
  if (s == "fp32" || s == "float32") return DType::kFloat32;
  if (s == "fp16" || s == "float16") return DType::kFloat16;
  if (s == "bf16" || s == "bfloat16") return DType::kBFloat16;
  if (s == "fp8_e4m3" || s == "float8_e4m3") return DType::kFloat8E4M3;
  if (s == "fp8_e5m2" || s == "float8_e5m2") return DType::kFloat8E5M2;
  return std::nullopt;
}

}  // namespace pagoda
