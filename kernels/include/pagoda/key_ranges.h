#pragma once
// Which keys each query row attends (docs/design.md §9), for the CPU backend, the CUDA
// kernels and the tests alike. Causality is bottom-right aligned: of a
// sequence's `length` tokens, its last `rows` are its query positions, and row
// i at position p = length - rows + i attends keys [0, p], only (p - W, p] with
// a sliding window W > 0.

#include <cstdint>

#include "pagoda/hd.h"

namespace pagoda {

struct KeySpan {
  int64_t begin;
  int64_t end;  // one past the last key; begin >= end: none
};

// Keys in span k.
HD int64_t span_tokens(KeySpan k) { return k.end > k.begin ? k.end - k.begin : 0; }

HD KeySpan row_keys(int64_t length, int32_t rows, int32_t i, int32_t window) {
  const int64_t p = length - rows + i;
  const int64_t begin = window > 0 && p - window + 1 > 0 ? p - window + 1 : 0;
  return {begin, p + 1};
}

// Chunks [first, end) of `chunk_tokens` that hold a key some row attends: the
// others are neither launched nor read. Rows' spans are contiguous and move
// forward with i, so their union is [row 0's begin, last row's end).
struct ChunkSpan {
  int32_t first;
  int32_t end;
  HD int32_t count() const { return end > first ? end - first : 0; }
};

HD ChunkSpan chunks_needed(int64_t length, int32_t rows, int32_t window, int32_t chunk_tokens) {
  if (rows <= 0 || length <= 0) return {0, 0};
  const KeySpan first = row_keys(length, rows, 0, window);
  const KeySpan last = row_keys(length, rows, rows - 1, window);
  return {static_cast<int32_t>(first.begin / chunk_tokens),
          static_cast<int32_t>((last.end + chunk_tokens - 1) / chunk_tokens)};
}

}  // namespace pagoda
