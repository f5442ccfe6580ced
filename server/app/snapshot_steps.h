#pragma once
// --snapshot-dir in a server's life (docs/design.md §13): the id state before serving,
// the sequences restored once listening (health NOT_SERVING meanwhile), and
// every sequence written after the drain. Separate steps so the start and
// shutdown paths only call them.

#include <string>

namespace pagoda {

class Authenticator;
class Backend;
class CacheManager;
class Metrics;

struct SnapshotParts {
  std::string dir;
  CacheManager* cache = nullptr;
  Backend* backend = nullptr;
  const Authenticator* auth = nullptr;
  Metrics* metrics = nullptr;
  int32_t max_label_bytes = 256;
  int64_t max_sequence_tokens = 0;
};

// Before any id is handed out: the MANIFEST's id permutation state. Returns
// whether there is a snapshot to restore (a bad MANIFEST is logged and
// restored as none).
bool restore_snapshot_ids(const SnapshotParts& parts);
// Imports the snapshot's sequences and logs and counts the outcome.
void restore_snapshot_sequences(const SnapshotParts& parts);
// After the drain: writes every sequence; logs and counts the outcome.
void write_snapshot_after_drain(const SnapshotParts& parts);

}  // namespace pagoda
