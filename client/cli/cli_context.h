#pragma once
// What every pagoda-cli command shares: the global flags and the exit code the
// command leaves for main().

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>

#include "pagoda/client/client.h"

namespace pagoda::client {

struct CliContext {
  std::string server = "127.0.0.1:50051";
  int64_t timeout_ms = 10000;  // deadline of each call; 0 = none
  std::string token;           // bearer token; empty: none
  bool tls = false;            // TLS (implied by any --tls-* file)
  std::string tls_ca;          // PEM file: roots the server's certificate is verified against
  std::string tls_cert;        // PEM file: this client's certificate (mTLS)
  std::string tls_key;         // PEM file: its private key
  int exit_code = 0;

  // The options above, with the PEM files' contents (checked to exist by the flags).
  ClientOptions options() const;
  std::unique_ptr<Client> connect() const { return Client::connect(server, options()); }
};

// Prints the error to stderr and returns the exit code for a failed call (1).
int report_error(const Error& error);

}  // namespace pagoda::client
