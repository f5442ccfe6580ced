#pragma once
// The --auth-tokens file: one entry a line, `TENANT TOKEN [max_blocks=N]
// [max_sequences=N]`; `#` starts a comment, blank lines are ignored. A tenant
// may have several tokens (rotation: add the new one, reload, retire the old);
// its quotas may be given on any of its lines, and must not disagree.

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "pagoda/status.h"

namespace pagoda {

struct TokenEntry {
  std::string tenant;
  std::string token;
  int32_t line = 0;  // 1-based, for messages
};

struct TenantEntry {
  std::string name;
  std::optional<int64_t> max_blocks;     // unset: --tenant-max-blocks
  std::optional<int64_t> max_sequences;  // unset: --tenant-max-sequences
};

struct TokensFile {
  std::vector<TokenEntry> tokens;
  std::vector<TenantEntry> tenants;  // each once, in order of first appearance
};

// Errors name the file, the line number and what is wrong with it (never the
// token itself).
StatusOr<TokensFile> parse_tokens(std::string_view text, std::string_view path);
StatusOr<TokensFile> read_tokens_file(const std::string& path);

}  // namespace pagoda
