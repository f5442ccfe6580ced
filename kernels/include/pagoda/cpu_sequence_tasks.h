#pragma once
// Sequence tasks of the CPU backend: one task walking all of a sequence's
// chunks in order (per KV head and group of rows), merging each chunk's state
// into a running one as it goes, where a launch would otherwise run a task per
// chunk and merge the chunks' states afterwards. Both fold the chunks left to
// right with the same merge, so a row's bits are the same either way
// (docs/design.md §2, "Sequence tasks"); the launch picks per sequence, by how
// well its threads stay balanced.

#include <optional>

namespace pagoda::cpu {

// Forces every launch of the process to run each eligible sequence as one
// task (true) or every chunk as its own (false), or (nullopt) back to the
// launch's own choice: for the tests and benches that compare both. A
// sequence is eligible where its chunks are whole sub-blocks long and none of
// them is shared with another sequence. Call before any decode runs.
void force_sequence_tasks(std::optional<bool> on);

}  // namespace pagoda::cpu
