#pragma once
// Element types of the cache and of tensors on the wire, in one table
// (kDTypes): names, sizes and which may travel on a Tensor. The numbers match
// the wire contract's DType enum (pagoda.v1.DType).

#include <array>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string_view>

#include "pagoda/hd.h"

namespace pagoda {

// The fp8 types (OCP FP8: e4m3 with bias 7, no infinities and max 448; e5m2
// with bias 15 and max finite 57344) are cache dtypes only: tensors on the
// wire are fp32, fp16 or bf16 (docs/design.md, "fp8 cache").
enum class DType : uint8_t { kFloat32 = 1, kFloat16 = 2, kBFloat16 = 3, kFloat8E4M3 = 4, kFloat8E5M2 = 5 };

struct DTypeInfo {
  DType type;
  std::string_view name;       // the flag spelling: "fp16"
  std::string_view long_name;  // also accepted: "float16"
  std::string_view wire_name;  // the proto enumerator: "FLOAT16"
  size_t size;                 // bytes per element
  bool wire;                   // valid on a Tensor (the others are cache dtypes only)
};

inline constexpr std::array<DTypeInfo, 5> kDTypes = {{
    {DType::kFloat32, "fp32", "float32", "FLOAT32", 4, true},
    {DType::kFloat16, "fp16", "float16", "FLOAT16", 2, true},
    {DType::kBFloat16, "bf16", "bfloat16", "BFLOAT16", 2, true},
    {DType::kFloat8E4M3, "fp8_e4m3", "float8_e4m3", "FLOAT8_E4M3", 1, false},
    {DType::kFloat8E5M2, "fp8_e5m2", "float8_e5m2", "FLOAT8_E5M2", 1, false},
}};

// The helpers device code calls are switches (no table in device memory); a
// static_assert below holds them to the table.
HD constexpr size_t dtype_size(DType t) {
  return t == DType::kFloat32 ? 4 : (t == DType::kFloat8E4M3 || t == DType::kFloat8E5M2) ? 1 : 2;
}

HD constexpr bool is_fp8(DType t) { return t == DType::kFloat8E4M3 || t == DType::kFloat8E5M2; }

// Whether `t` is one of the enumerators (a value read from the wire may not be).
HD constexpr bool known_dtype(DType t) {
  return t == DType::kFloat32 || t == DType::kFloat16 || t == DType::kBFloat16 || is_fp8(t);
}

// The dtypes a tensor on the wire may have (and a client's values be sent as).
HD constexpr bool tensor_dtype(DType t) {
  return t == DType::kFloat32 || t == DType::kFloat16 || t == DType::kBFloat16;
}

constexpr bool dtype_table_matches_helpers() {
  for (const DTypeInfo& t : kDTypes) {
    if (t.size != dtype_size(t.type) || t.wire != tensor_dtype(t.type) || !known_dtype(t.type) ||
        (t.size == 1) != is_fp8(t.type)) {
      return false;
    }
  }
  return true;
}
static_assert(dtype_table_matches_helpers(), "kDTypes disagrees with dtype_size / tensor_dtype / is_fp8");

constexpr const DTypeInfo* dtype_info(DType t) {
  for (const DTypeInfo& i : kDTypes) {
    if (i.type == t) return &i;
  }
  return nullptr;
}

inline std::string_view dtype_name(DType t) {
  const DTypeInfo* i = dtype_info(t);
  return i != nullptr ? i->name : "unknown";
}

// Accepts the flag spellings (fp16) and the long ones (float16).
inline std::optional<DType> parse_dtype(std::string_view s) {
  for (const DTypeInfo& i : kDTypes) {
    if (s == i.name || s == i.long_name) return i.type;
  }
  return std::nullopt;
}

}  // namespace pagoda
