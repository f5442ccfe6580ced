#pragma once
// Sequence ids a client cannot predict and the server never hands out twice:
// a keyed permutation of a counter. The counter makes every id distinct while
// the server runs (a permutation of 2^64 values repeats nothing), the key (from
// the kernel's CSPRNG, getrandom) makes the order unpredictable, so
// consecutive ids share nothing. Isolation itself does not rest on this:
// lookups are scoped by tenant (cache_manager.h).

#include <array>
#include <cstdint>

#include "cache/reservation.h"  // SequenceId

namespace pagoda {

class SequenceIdGenerator {
 public:
  // Keys from getrandom(2).
  SequenceIdGenerator();
  // Keyed with `key` instead (tests that need a fixed order).
  explicit SequenceIdGenerator(const std::array<uint64_t, 4>& key) : key_(key) {}

  // The next id: never 0, never one returned before.
  SequenceId next();

  // Key and counter: a generator given the state of another continues its
  // permutation where it stopped (a snapshot's restore: the old ids stay
  // valid and no new id repeats one).
  struct State {
    std::array<uint64_t, 4> key{};
    uint64_t counter = 0;
  };
  State state() const { return {key_, counter_}; }
  void restore(const State& state) {
    key_ = state.key;
    counter_ = state.counter;
  }

 private:
  std::array<uint64_t, 4> key_{};
  uint64_t counter_ = 0;
};

}  // namespace pagoda
