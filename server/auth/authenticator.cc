#include "auth/authenticator.h"

#include "auth/constant_time.h"

#include <algorithm>
#include <variant>

namespace pagoda {
namespace {

constexpr std::string_view kScheme = "Bearer ";

}  // namespace

const char* auth_failure_name(AuthFailure f) {
  switch (f) {
    case AuthFailure::kMissing: return "missing";
    case AuthFailure::kMalformed: return "malformed";
    case AuthFailure::kUnknown: return "unknown";
  }
  return "unknown";
}

StatusOr<std::unique_ptr<Authenticator>> Authenticator::from_file(const std::string& path, TenantQuota defaults) {
  StatusOr<TokensFile> file = read_tokens_file(path);
  if (!file.ok()) return file.status();
  if (file->tokens.empty()) return InvalidArgument("--auth-tokens {}: expected at least one token, received none", path);
  auto a = std::make_unique<Authenticator>();
  a->path_ = path;
  a->defaults_ = defaults;
  PAGODA_RETURN_IF_ERROR(a->install(*file));
  return a;
}

Status Authenticator::reload() {
  if (!enabled()) return Status::Ok();
  StatusOr<TokensFile> file = read_tokens_file(path_);
  if (!file.ok()) return file.status();
  if (file->tokens.empty()) return InvalidArgument("--auth-tokens {}: expected at least one token, received none", path_);
  return install(*file);
}

Status Authenticator::install(const TokensFile& file) {
  auto table = std::make_shared<Table>();
  std::lock_guard lock(mu_);
  for (const TenantEntry& t : file.tenants) {
    TenantQuota q{t.max_blocks.value_or(defaults_.max_blocks), t.max_sequences.value_or(defaults_.max_sequences)};
    auto it = std::find_if(tenants_.begin(), tenants_.end(), [&](const Tenant& known) { return known.name == t.name; });
    if (it == tenants_.end()) {
      tenants_.push_back({static_cast<TenantId>(tenants_.size() + 1), t.name, q});
    } else {
      it->quota = q;
    }
  }
  for (const TokenEntry& e : file.tokens) {
    auto it = std::find_if(tenants_.begin(), tenants_.end(), [&](const Tenant& t) { return t.name == e.tenant; });
    table->tokens.emplace_back(e.token, it->id);
  }
  table_ = std::move(table);
  generation_.fetch_add(1, std::memory_order_acq_rel);
  return Status::Ok();
}

std::variant<TenantId, Authenticator::Refusal> Authenticator::authenticate(
    std::optional<std::string_view> header) const {
  if (!enabled()) return kDefaultTenant;
  if (!header) {
    return Refusal{AuthFailure::kMissing,
                   Unauthenticated("authorization: expected metadata 'authorization: Bearer TOKEN', received none")};
  }
  if (header->size() <= kScheme.size() || header->substr(0, kScheme.size()) != kScheme) {
    return Refusal{AuthFailure::kMalformed,
                   Unauthenticated("authorization: expected 'Bearer TOKEN', received a value of another form")};
  }
  const std::string_view token = header->substr(kScheme.size());
  std::shared_ptr<const Table> table;
  {
    std::lock_guard lock(mu_);
    table = table_;
  }
  // Every entry is compared, match or not.
  TenantId found = 0;
  uint8_t matched = 0;
  for (const auto& [known, tenant] : table->tokens) {
    const uint8_t eq = equal_in_constant_time(token, known);
    found |= static_cast<TenantId>(-static_cast<int32_t>(eq)) & tenant;
    matched |= eq;
  }
  if (!matched) {
    return Refusal{AuthFailure::kUnknown, Unauthenticated("authorization: unknown or revoked token")};
  }
  return found;
}

std::string Authenticator::tenant_name(TenantId id) const {
  if (id == kDefaultTenant) return "default";
  std::lock_guard lock(mu_);
  return id <= tenants_.size() ? tenants_[id - 1].name : "unknown";
}

std::vector<Authenticator::Tenant> Authenticator::tenants() const {
  std::lock_guard lock(mu_);
  return tenants_;
}

TenantQuota Authenticator::quota(TenantId id) const {
  if (id == kDefaultTenant) return defaults_;
  std::lock_guard lock(mu_);
  return id <= tenants_.size() ? tenants_[id - 1].quota : defaults_;
}

}  // namespace pagoda
