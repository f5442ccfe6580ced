#pragma once
// The file of --metrics-auth: one line `USER:PASSWORD`, the HTTP basic-auth
// credentials /metrics asks for (a file, so that the secret is in neither the
// command line nor the environment). Read and checked at start: a file that
// cannot be read or is not of that form fails the start (exit 2) naming the
// flag, the path and the reason, never the password.

#include <string>

#include "pagoda/status.h"

namespace pagoda {

struct MetricsCredentials {
  std::string user;  // empty: /metrics asks for none
  std::string password;
};

// Empty credentials for an empty path.
StatusOr<MetricsCredentials> read_metrics_auth_file(const std::string& path);

}  // namespace pagoda
