#include "cache/sequence_ids.h"

#include <sys/random.h>

#include <cerrno>
#include <cstring>
#include <stdexcept>
#include <string>

namespace pagoda {
namespace {

// A 64-bit mixing function (a multiply-xorshift finaliser): every input bit
// reaches every output bit.
uint64_t mix(uint64_t x) {
  x ^= x >> 33;
  x *= 0xFF51AFD7ED558CCDull;
  x ^= x >> 33;
  x *= 0xC4CEB9FE1A85EC53ull;
  x ^= x >> 33;
  return x;
}

constexpr int kRounds = 8;

}  // namespace

SequenceIdGenerator::SequenceIdGenerator() {
  auto* bytes = reinterpret_cast<unsigned char*>(key_.data());
  size_t have = 0;
  while (have < sizeof key_) {
    const ssize_t n = getrandom(bytes + have, sizeof key_ - have, 0);
    if (n < 0 && errno == EINTR) continue;
    // Only on a kernel without getrandom (before Linux 3.17): nothing to serve safely with.
    if (n < 0) throw std::runtime_error(std::string("getrandom: ") + std::strerror(errno));
    have += static_cast<size_t>(n);
  }
}

SequenceId SequenceIdGenerator::next() {
  for (;;) {
    // A balanced Feistel network over the counter's two 32-bit halves: a
    // bijection whatever the round function, so distinct counters give
    // distinct ids.
    const uint64_t c = ++counter_;
    auto left = static_cast<uint32_t>(c >> 32), right = static_cast<uint32_t>(c);
    for (int r = 0; r < kRounds; ++r) {
      const uint64_t k = key_[static_cast<size_t>(r) % key_.size()] + static_cast<uint64_t>(r);
      const auto f = static_cast<uint32_t>(mix((static_cast<uint64_t>(right) << 32 | right) ^ k) >> 32);
      const uint32_t next_right = left ^ f;
      left = right;
      right = next_right;
    }
    const SequenceId id = static_cast<uint64_t>(left) << 32 | right;
    if (id != 0) return id;  // 0 means "none" on the wire: skip the one counter that maps to it
  }
}

}  // namespace pagoda
