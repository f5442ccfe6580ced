#pragma once
// The PEM files of --tls-cert, --tls-key and --tls-client-ca, read and checked
// at start: a file that cannot be read or holds no PEM block of the expected
// kind fails the start (exit 2) naming the flag, the path and the reason.

#include <string>

#include "pagoda/status.h"

namespace pagoda {

struct ServerConfig;

struct TlsFiles {
  std::string cert_chain;   // PEM; empty: plaintext
  std::string private_key;  // PEM
  std::string client_ca;    // PEM; non-empty: client certificates required and verified (mTLS)
  bool enabled() const { return !cert_chain.empty(); }
};

StatusOr<TlsFiles> read_tls_files(const ServerConfig& config);

}  // namespace pagoda
