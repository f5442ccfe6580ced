#pragma once
// Element types of the cache and of tensors on the wire. The numbers match the
// wire contract's DType enum (pagoda.v1.DType).

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string_view>

#include "pagoda/hd.h"

namespace pagoda {

enum class DType : uint8_t { kFloat32 = 1, kFloat16 = 2, kBFloat16 = 3 };

HD size_t dtype_size(DType t) { return t == DType::kFloat32 ? 4 : 2; }

// Whether `t` is one of the enumerators (a value read from the wire may not be).
HD bool known_dtype(DType t) {
  return t == DType::kFloat32 || t == DType::kFloat16 || t == DType::kBFloat16;
}

inline std::string_view dtype_name(DType t) {
  switch (t) {
    case DType::kFloat32: return "fp32";
    case DType::kFloat16: return "fp16";
    case DType::kBFloat16: return "bf16";
  }
  return "unknown";
}

// Accepts the flag spellings fp32/fp16/bf16 (and float32/float16/bfloat16).
inline std::optional<DType> parse_dtype(std::string_view s) {
  if (s == "fp32" || s == "float32") return DType::kFloat32;
  if (s == "fp16" || s == "float16") return DType::kFloat16;
  if (s == "bf16" || s == "bfloat16") return DType::kBFloat16;
  return std::nullopt;
}

}  // namespace pagoda
