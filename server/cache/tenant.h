#pragma once
// Tenants as the cache knows them: a small number per tenant (auth/ maps
// tokens to names and names to numbers). Every sequence belongs to one, and
// a lookup by another tenant finds nothing (docs/design.md §10).

#include <cstdint>
#include <string>

namespace pagoda {

using TenantId = uint32_t;
// Every call's tenant when the server runs without --auth-tokens.
inline constexpr TenantId kDefaultTenant = 0;

// What a tenant may hold (0: no limit), and its name for messages.
struct TenantLimits {
  std::string name = "default";
  int64_t max_blocks = 0;
  int64_t max_sequences = 0;
};

// What a tenant holds: blocks it allocated that are not back on the free
// list (a block a fork shares counts once), and its sequences.
struct TenantUsage {
  int64_t blocks = 0;
  int64_t sequences = 0;
};

}  // namespace pagoda
