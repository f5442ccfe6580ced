#pragma once
// The flags every pagoda-cli command and pagoda-bench subcommand share to
// reach a server: its address, a bearer token and TLS files (README,
// "Securing pagoda"). Environment: PAGODA_SERVER, PAGODA_TOKEN, PAGODA_TLS,
// PAGODA_TLS_CA, PAGODA_TLS_CERT, PAGODA_TLS_KEY.

#include <string>

#include <CLI/CLI.hpp>

#include "pagoda/client/client.h"

namespace pagoda::client {

struct ConnectionFlags {
  std::string server = "127.0.0.1:50051";
  std::string token;     // bearer token; empty: none
  bool tls = false;      // TLS (implied by any --tls-* file)
  std::string tls_ca;    // PEM file: roots the server's certificate is verified against
  std::string tls_cert;  // PEM file: this client's certificate (mTLS)
  std::string tls_key;   // PEM file: its private key

  // Registers --server, --token, --tls, --tls-ca, --tls-cert, --tls-key on `app`.
  void add_to(CLI::App& app);
  // ClientOptions with the token and the PEM files' contents (the flags
  // check that the files exist) on top of `base`.
  ClientOptions options(ClientOptions base = {}) const;
  std::unique_ptr<Client> connect(ClientOptions base = {}) const { return Client::connect(server, options(base)); }
};

}  // namespace pagoda::client
