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

// The head shapes every backend is instantiated for (CPU and CUDA alike): K
// rows of head_dim elements, V rows of v_head_dim. v_head_dim < head_dim is
// latent attention (MLA, docs/design.md §16): V is the first v_head_dim
// elements of K's row, stored once (576 = 512 latent + 64 RoPE: DeepSeek-V2/V3,
// Kimi K2). One entry per head_dim.
struct HeadShape {
  int32_t head_dim;
  int32_t v_head_dim;
};
inline constexpr std::array<HeadShape, 4> kHeadShapes = {{{64, 64}, {128, 128}, {256, 256}, {576, 512}}};

// The head dims of kHeadShapes, in its order.
inline constexpr std::array<int32_t, kHeadShapes.size()> kHeadDims = [] {
  std::array<int32_t, kHeadShapes.size()> dims{};
  for (size_t i = 0; i < kHeadShapes.size(); ++i) dims[i] = kHeadShapes[i].head_dim;
  return dims;
}();

// The v_head_dim kHeadShapes pairs with head_dim (0 when head_dim is not there).
constexpr int32_t v_head_dim_for(int32_t head_dim) {
  for (const HeadShape& s : kHeadShapes) {
    if (s.head_dim == head_dim) return s.v_head_dim;
  }
  return 0;
}

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

// "64, 128, 256 or 576"; "fp32, fp16, bf16, fp8_e4m3 or fp8_e5m2"; "FLOAT32,
// FLOAT16 or BFLOAT16" (wire_only): the lists validation messages print.
std::string head_dim_list();
std::string cache_dtype_list();
std::string wire_dtype_list();

}  // namespace pagoda
