#include "connection_flags.h"

#include <fstream>
#include <sstream>

namespace pagoda::client {
namespace {

std::string file_text(const std::string& path) {
  if (path.empty()) return {};
  std::ifstream in(path, std::ios::binary);
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

}  // namespace

void ConnectionFlags::add_to(CLI::App& app) {
  app.add_option("--server", server, "Server address host:port")->envname("PAGODA_SERVER")->capture_default_str();
  app.add_option("--token", token, "Bearer token for a server with --auth-tokens")->envname("PAGODA_TOKEN");
  app.add_flag("--tls", tls, "Connect with TLS (verified against the system's roots unless --tls-ca)")
      ->envname("PAGODA_TLS");
  app.add_option("--tls-ca", tls_ca, "PEM CA file the server's certificate must chain to (implies --tls)")
      ->envname("PAGODA_TLS_CA")
      ->check(CLI::ExistingFile);
  app.add_option("--tls-cert", tls_cert, "PEM client certificate, for a server that requires one (mTLS)")
      ->envname("PAGODA_TLS_CERT")
      ->check(CLI::ExistingFile);
  app.add_option("--tls-key", tls_key, "PEM private key of --tls-cert")
      ->envname("PAGODA_TLS_KEY")
      ->check(CLI::ExistingFile);
}

ClientOptions ConnectionFlags::options(ClientOptions o) const {
  o.token = token;
  o.tls = tls || !tls_ca.empty() || !tls_cert.empty() || !tls_key.empty();
  o.tls_root_certs = file_text(tls_ca);
  o.tls_cert_chain = file_text(tls_cert);
  o.tls_private_key = file_text(tls_key);
  return o;
}

}  // namespace pagoda::client
