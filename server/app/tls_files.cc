#include "app/tls_files.h"

#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>

#include "app/server_config.h"

namespace pagoda {
namespace {

// The file's text, or why it cannot be used as `what` (a PEM block whose
// BEGIN line contains `marker`).
StatusOr<std::string> read_pem(const char* flag, const std::string& path, const char* marker, const char* what) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return InvalidArgument("{}: cannot read '{}': {}", flag, path, std::strerror(errno));
  std::ostringstream text;
  text << in.rdbuf();
  std::string pem = text.str();
  const size_t begin = pem.find("-----BEGIN ");
  const size_t line_end = begin == std::string::npos ? std::string::npos : pem.find('\n', begin);
  const bool found = begin != std::string::npos && pem.substr(begin, line_end - begin).find(marker) != std::string::npos;
  if (!found) return InvalidArgument("{}: expected {} in PEM form in '{}', found none", flag, what, path);
  return pem;
}

}  // namespace

StatusOr<TlsFiles> read_tls_files(const ServerConfig& c) {
  TlsFiles files;
  if (c.tls_cert.empty() != c.tls_key.empty()) {
    return InvalidArgument("--tls-cert, --tls-key: expected both or neither, received only {}",
                           c.tls_cert.empty() ? "--tls-key" : "--tls-cert");
  }
  if (!c.tls_client_ca.empty() && c.tls_cert.empty()) {
    return InvalidArgument("--tls-client-ca: expected with --tls-cert and --tls-key (mTLS is TLS first), "
                           "received without them");
  }
  if (c.tls_cert.empty()) return files;
  StatusOr<std::string> cert = read_pem("--tls-cert", c.tls_cert, "CERTIFICATE", "a certificate");
  if (!cert.ok()) return cert.status();
  StatusOr<std::string> key = read_pem("--tls-key", c.tls_key, "PRIVATE KEY", "a private key");
  if (!key.ok()) return key.status();
  files.cert_chain = std::move(*cert);
  files.private_key = std::move(*key);
  if (!c.tls_client_ca.empty()) {
    StatusOr<std::string> ca = read_pem("--tls-client-ca", c.tls_client_ca, "CERTIFICATE", "a CA certificate");
    if (!ca.ok()) return ca.status();
    files.client_ca = std::move(*ca);
  }
  return files;
}

}  // namespace pagoda
