// pagoda-cli: a command-line client of the pagoda decode-attention service.
#include <cstdlib>
#include <iostream>

#include <fstream>
#include <sstream>

#include <CLI/CLI.hpp>

#include "cli_context.h"
#include "commands.h"
#include "demo.h"

namespace pagoda::client {

int report_error(const Error& error) {
  std::cerr << "error: " << error.to_string() << "\n";
  return 1;
}

namespace {

std::string file_text(const std::string& path) {
  if (path.empty()) return {};
  std::ifstream in(path, std::ios::binary);
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

}  // namespace

ClientOptions CliContext::options() const {
  ClientOptions o;
  o.timeout = std::chrono::milliseconds(timeout_ms);
  o.token = token;
  o.tls = tls || !tls_ca.empty() || !tls_cert.empty() || !tls_key.empty();
  o.tls_root_certs = file_text(tls_ca);
  o.tls_cert_chain = file_text(tls_cert);
  o.tls_private_key = file_text(tls_key);
  return o;
}

}  // namespace pagoda::client

int main(int argc, char** argv) {
  pagoda::client::CliContext ctx;
  CLI::App app{"pagoda-cli: client of the pagoda decode-attention service (pagoda.v1)"};
  app.require_subcommand(1);
  app.add_option("--server", ctx.server, "Server address host:port")
      ->envname("PAGODA_SERVER")
      ->capture_default_str();
  app.add_option("--timeout-ms", ctx.timeout_ms, "Deadline of each call in milliseconds (0 = none)")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  app.add_option("--token", ctx.token, "Bearer token for a server with --auth-tokens")->envname("PAGODA_TOKEN");
  app.add_flag("--tls", ctx.tls, "Connect with TLS (verified against the system's roots unless --tls-ca)")
      ->envname("PAGODA_TLS");
  app.add_option("--tls-ca", ctx.tls_ca, "PEM CA file the server's certificate must chain to (implies --tls)")
      ->envname("PAGODA_TLS_CA")->check(CLI::ExistingFile);
  app.add_option("--tls-cert", ctx.tls_cert, "PEM client certificate, for a server that requires one (mTLS)")
      ->envname("PAGODA_TLS_CERT")->check(CLI::ExistingFile);
  app.add_option("--tls-key", ctx.tls_key, "PEM private key of --tls-cert")
      ->envname("PAGODA_TLS_KEY")->check(CLI::ExistingFile);
  pagoda::client::add_rpc_commands(app, ctx);
  pagoda::client::add_demo_command(app, ctx);
  CLI11_PARSE(app, argc, argv);
  return ctx.exit_code;
}
