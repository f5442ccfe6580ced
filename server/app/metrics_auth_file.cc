#include "app/metrics_auth_file.h"

#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>

namespace pagoda {

StatusOr<MetricsCredentials> read_metrics_auth_file(const std::string& path) {
  MetricsCredentials c;
  if (path.empty()) return c;
  std::ifstream in(path, std::ios::binary);
  if (!in) return InvalidArgument("--metrics-auth: cannot read '{}': {}", path, std::strerror(errno));
  std::ostringstream text;
  text << in.rdbuf();
  std::string line = text.str();
  // One line; a trailing newline (as editors and Kubernetes Secrets write it) is not part of the password.
  while (!line.empty() && (line.back() == '\n' || line.back() == '\r')) line.pop_back();
  const size_t colon = line.find(':');
  if (line.find('\n') != std::string::npos || colon == std::string::npos || colon == 0 || colon + 1 == line.size()) {
    return InvalidArgument("--metrics-auth: expected one line 'USER:PASSWORD' (both non-empty) in '{}', received "
                           "another form",
                           path);
  }
  c.user = line.substr(0, colon);
  c.password = line.substr(colon + 1);
  return c;
}

}  // namespace pagoda
