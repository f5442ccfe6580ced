#pragma once
// Bearer-token authentication (docs/design.md §10): the `authorization: Bearer TOKEN`
// metadata of a call names its tenant. Off (no --auth-tokens), every call is
// the default tenant. Tokens are compared in constant time (no early exit on
// the first differing byte or on a match) and never logged; reload() swaps in
// a re-read file whole, or keeps the old one when the new one is invalid.
// Tenant numbers are stable across reloads: a tenant keeps its number (and
// its sequences) when its tokens change.

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "auth/tokens_file.h"
#include "cache/tenant.h"
#include "pagoda/status.h"

namespace pagoda {

struct TenantQuota {
  int64_t max_blocks = 0;     // 0: no limit
  int64_t max_sequences = 0;  // 0: no limit
};

// Why a call was refused (the auth-failure metric's reason label).
enum class AuthFailure { kMissing, kMalformed, kUnknown };
const char* auth_failure_name(AuthFailure f);

class Authenticator {
 public:
  // Auth off: every call is kDefaultTenant, named "default".
  Authenticator() = default;
  // Auth on, from the tokens file at `path`; `defaults` are the quotas of
  // tenants whose lines give none.
  static StatusOr<std::unique_ptr<Authenticator>> from_file(const std::string& path, TenantQuota defaults);

  bool enabled() const { return !path_.empty(); }
  // Re-reads the file: on success the new tokens apply from the next call;
  // on error nothing changes and the error says why.
  Status reload();
  // Changes with every installed file: a DecodeStream authenticated under an
  // older generation checks its token again before its next request.
  uint64_t generation() const { return generation_.load(std::memory_order_acquire); }

  struct Refusal {
    AuthFailure reason;
    Status status;  // UNAUTHENTICATED
  };
  // The tenant of a call whose `authorization` metadata is `header` (nullopt:
  // none sent).
  std::variant<TenantId, Refusal> authenticate(std::optional<std::string_view> header) const;

  std::string tenant_name(TenantId id) const;
  // Every tenant the file names (all of them ever, across reloads), with its quota.
  struct Tenant {
    TenantId id;
    std::string name;
    TenantQuota quota;
  };
  std::vector<Tenant> tenants() const;
  TenantQuota quota(TenantId id) const;

 private:
  struct Table {
    std::vector<std::pair<std::string, TenantId>> tokens;
  };
  Status install(const TokensFile& file);

  std::string path_;
  TenantQuota defaults_;
  mutable std::mutex mu_;
  std::shared_ptr<const Table> table_;  // swapped whole under mu_
  std::vector<Tenant> tenants_;         // [id - 1], under mu_; grows only
  std::atomic<uint64_t> generation_{0};
};

}  // namespace pagoda
