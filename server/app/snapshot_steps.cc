#include "app/snapshot_steps.h"

#include <spdlog/spdlog.h>

#include "auth/authenticator.h"
#include "observability/metrics.h"
#include "transfer/snapshot.h"

namespace pagoda {
namespace {

SnapshotContext context_of(const SnapshotParts& p) {
  SnapshotContext c;
  c.dir = p.dir;
  c.cache = p.cache;
  c.backend = p.backend;
  const Authenticator* auth = p.auth;
  c.tenant_name = [auth](TenantId id) { return id == kDefaultTenant ? std::string("default") : auth->tenant_name(id); };
  c.tenant_id = [auth](std::string_view name) -> std::optional<TenantId> {
    if (name == "default") return kDefaultTenant;
    for (const Authenticator::Tenant& t : auth->tenants()) {
      if (t.name == name) return t.id;
    }
    return std::nullopt;
  };
  c.max_label_bytes = p.max_label_bytes;
  c.max_sequence_tokens = p.max_sequence_tokens;
  return c;
}

}  // namespace

bool restore_snapshot_ids(const SnapshotParts& parts) {
  StatusOr<bool> found = restore_snapshot_ids(context_of(parts));
  if (!found.ok()) {
    spdlog::error("{}", found.status().message());
    return true;  // restore_snapshot_sequences counts and sets it aside
  }
  return *found;
}

void restore_snapshot_sequences(const SnapshotParts& parts) {
  const SnapshotStats stats = restore_snapshot(context_of(parts));
  parts.metrics->observe_snapshot(true, stats.seconds, stats.bytes, stats.failures);
  spdlog::info("snapshot: restored {} sequences ({} bytes) from {} in {:.3f} s, {} files skipped", stats.sequences,
               stats.bytes, parts.dir, stats.seconds, stats.failures);
}

void write_snapshot_after_drain(const SnapshotParts& parts) {
  StatusOr<SnapshotStats> stats = write_snapshot(context_of(parts));
  if (!stats.ok()) {
    spdlog::error("{}", stats.status().message());
    return;
  }
  parts.metrics->observe_snapshot(false, stats->seconds, stats->bytes, 0);
  spdlog::info("snapshot: wrote {} sequences ({} bytes) to {} in {:.3f} s{}", stats->sequences, stats->bytes,
               parts.dir, stats->seconds,
               stats->failures > 0 ? fmt::format(", {} not written", stats->failures) : std::string());
}

}  // namespace pagoda
