#pragma once
// The snapshot (docs/design.md §13, docs/snapshot-format.md): after the drain every
// sequence is written to --snapshot-dir in the export format, one file per
// sequence plus a MANIFEST (each written to a temporary name, fsynced,
// renamed; the directory fsynced last); at start the MANIFEST's id
// permutation state is restored before serving and every sequence it lists is
// imported with its id, tenant and label. A file that is corrupt, truncated or
// made by a server of another geometry is skipped (renamed *.failed) with an
// error line naming it; the rest restore.

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>

#include "cache/cache_manager.h"
#include "pagoda/backend.h"

namespace pagoda {

struct SnapshotContext {
  std::string dir;
  CacheManager* cache = nullptr;
  Backend* backend = nullptr;
  // Tenants by name in the files (ids are per process): id -> name, name -> id.
  std::function<std::string(TenantId)> tenant_name;
  std::function<std::optional<TenantId>(std::string_view)> tenant_id;
  int32_t max_label_bytes = 256;
  int64_t max_sequence_tokens = 0;
};

struct SnapshotStats {
  int64_t sequences = 0;  // written, or restored
  int64_t bytes = 0;      // file bytes written or read
  int64_t failures = 0;   // files skipped (restore) or not written (write)
  double seconds = 0;
};

// Writes every sequence. Call after the drain, when nothing appends any more
// (a sequence freed meanwhile is left out). Errors: INTERNAL naming the path
// when the directory cannot be written.
StatusOr<SnapshotStats> write_snapshot(const SnapshotContext& context);

// Restores the id state when `context.dir` holds a MANIFEST (call before any
// id is handed out); false when there is none.
StatusOr<bool> restore_snapshot_ids(const SnapshotContext& context);

// Imports every sequence the MANIFEST lists, removes what it restored and the
// MANIFEST. Never fails a start: a bad file is counted in `failures`.
SnapshotStats restore_snapshot(const SnapshotContext& context);

}  // namespace pagoda
