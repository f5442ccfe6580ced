#include "auth/tokens_file.h"

#include <cerrno>
#include <charconv>
#include <cstring>
#include <fstream>
#include <sstream>
#include <unordered_map>

namespace pagoda {
namespace {

bool valid_tenant_name(std::string_view name) {
  if (name.empty() || name.size() > 64) return false;
  for (char c : name) {
    const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' ||
                    c == '_' || c == '.';
    if (!ok) return false;
  }
  return true;
}

std::vector<std::string_view> fields_of(std::string_view line) {
  std::vector<std::string_view> fields;
  size_t i = 0;
  while (i < line.size()) {
    while (i < line.size() && (line[i] == ' ' || line[i] == '\t')) ++i;
    size_t j = i;
    while (j < line.size() && line[j] != ' ' && line[j] != '\t') ++j;
    if (j > i) fields.push_back(line.substr(i, j - i));
    i = j;
  }
  return fields;
}

}  // namespace

StatusOr<TokensFile> parse_tokens(std::string_view text, std::string_view path) {
  TokensFile file;
  std::unordered_map<std::string, size_t> tenant_index;
  std::unordered_map<std::string, int32_t> token_line;
  int32_t number = 0;
  size_t start = 0;
  while (start <= text.size()) {
    size_t end = text.find('\n', start);
    if (end == std::string_view::npos) end = text.size();
    std::string_view line = text.substr(start, end - start);
    start = end + 1;
    ++number;
    if (const size_t hash = line.find('#'); hash != std::string_view::npos) line = line.substr(0, hash);
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    const std::vector<std::string_view> f = fields_of(line);
    if (f.empty()) {
      if (end == text.size()) break;
      continue;
    }
    auto bad = [&](std::string what) {
      return InvalidArgument("--auth-tokens {} line {}: {}", path, number, what);
    };
    if (f.size() < 2) return bad("expected 'TENANT TOKEN [max_blocks=N] [max_sequences=N]', received one field");
    if (!valid_tenant_name(f[0])) {
      return bad(fmt::format("tenant: expected 1 to 64 of [A-Za-z0-9._-], received '{}'", f[0]));
    }
    const std::string token(f[1]);
    if (auto seen = token_line.find(token); seen != token_line.end()) {
      return bad(fmt::format("token: expected each token once, received the token of line {} again", seen->second));
    }
    token_line.emplace(token, number);
    auto [it, added] = tenant_index.emplace(std::string(f[0]), file.tenants.size());
    if (added) file.tenants.push_back({std::string(f[0]), std::nullopt, std::nullopt});
    TenantEntry& tenant = file.tenants[it->second];
    for (size_t i = 2; i < f.size(); ++i) {
      const size_t eq = f[i].find('=');
      const std::string_view key = f[i].substr(0, eq);
      std::optional<int64_t>* slot = key == "max_blocks" ? &tenant.max_blocks
                                     : key == "max_sequences" ? &tenant.max_sequences
                                                              : nullptr;
      if (slot == nullptr || eq == std::string_view::npos) {
        return bad(fmt::format("expected max_blocks=N or max_sequences=N, received '{}'", f[i]));
      }
      const std::string_view digits = f[i].substr(eq + 1);
      int64_t value = -1;
      const auto [ptr, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), value);
      if (ec != std::errc() || ptr != digits.data() + digits.size() || value < 0) {
        return bad(fmt::format("{}: expected an integer >= 0, received '{}'", key, digits));
      }
      if (slot->has_value() && **slot != value) {
        return bad(fmt::format("{}: expected the value tenant '{}' has on an earlier line ({}), received {}", key,
                               tenant.name, **slot, value));
      }
      *slot = value;
    }
    file.tokens.push_back({std::string(f[0]), token, number});
    if (end == text.size()) break;
  }
  return file;
}

StatusOr<TokensFile> read_tokens_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return InvalidArgument("--auth-tokens: cannot read '{}': {}", path, std::strerror(errno));
  std::ostringstream text;
  text << in.rdbuf();
  return parse_tokens(text.str(), path);
}

}  // namespace pagoda
