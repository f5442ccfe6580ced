#pragma once
// Secrets compared in time that depends on the lengths only (no early exit on
// the first differing byte or on a match): bearer tokens and the metrics
// port's basic-auth credentials.

#include <cstddef>
#include <cstdint>
#include <string_view>

namespace pagoda {

// 1 when a == b, else 0.
inline uint8_t equal_in_constant_time(std::string_view a, std::string_view b) {
  uint8_t diff = a.size() == b.size() ? 0 : 1;
  const size_t n = a.size();
  for (size_t i = 0; i < n; ++i) {
    const char other = b.empty() ? 0 : b[i % b.size()];
    diff |= static_cast<uint8_t>(a[i] ^ other);
  }
  return static_cast<uint8_t>(diff == 0);
}

}  // namespace pagoda
