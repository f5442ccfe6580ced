#pragma once
// The vocabulary of the kernels: the head dims they are instantiated for (this
// table) and the element types (kDTypes in pagoda/dtype.h). Validation
// messages, the CPU dispatch, the CUDA instance lists and the accumulator bound
// all read these tables, so a new head dim or dtype is one line (and a compile
// error wherever an instance is missing). Host and device code alike.

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>

#include "pagoda/dtype.h"

namespace pagoda {

// ---- head dims ------------------------------------------------------------------

// Head dimensions every backend is instantiated for (CPU and CUDA alike).
inline constexpr std::array<int32_t, 3> kHeadDims = {64, 128, 256};

constexpr int32_t max_head_dim() {
  int32_t m = 0;
  for (int32_t d : kHeadDims) m = d > m ? d : m;
  return m;
}
// Bound of a fixed-size accumulator row (the CPU merge's, the tests').
inline constexpr int32_t kMaxHeadDim = max_head_dim();

constexpr bool supported_head_dim(int32_t head_dim) {
  for (int32_t d : kHeadDims) {
    if (d == head_dim) return true;
  }
  return false;
}

// Calls fn(std::integral_constant<int, D>{}) for the D of kHeadDims equal to
// head_dim and returns its result; fallback() when none is (a value the rules
// of geometry_rules.h let through can never get there).
template <typename Fn, typename Fallback, size_t... I>
constexpr decltype(auto) dispatch_head_dim_impl(int32_t head_dim, Fn&& fn, Fallback&& fallback,
                                                std::index_sequence<I...>) {
  using R = decltype(fn(std::integral_constant<int, kHeadDims[0]>{}));
  if constexpr (std::is_void_v<R>) {
    const bool found = ((head_dim == kHeadDims[I] ? (fn(std::integral_constant<int, kHeadDims[I]>{}), true) : false) ||
                        ...);
    if (!found) fallback();
  } else {
    R result{};
    const bool found =
        ((head_dim == kHeadDims[I] ? (result = fn(std::integral_constant<int, kHeadDims[I]>{}), true) : false) || ...);
    if (!found) return fallback();
    return result;
  }
}

template <typename Fn, typename Fallback>
constexpr decltype(auto) dispatch_head_dim(int32_t head_dim, Fn&& fn, Fallback&& fallback) {
  return dispatch_head_dim_impl(head_dim, std::forward<Fn>(fn), std::forward<Fallback>(fallback),
                                std::make_index_sequence<kHeadDims.size()>{});
}

// "64, 128 or 256"; "fp32, fp16, bf16, fp8_e4m3 or fp8_e5m2"; "FLOAT32,
// FLOAT16 or BFLOAT16" (wire_only): the lists validation messages print.
std::string head_dim_list();
std::string cache_dtype_list();
std::string wire_dtype_list();

}  // namespace pagoda
