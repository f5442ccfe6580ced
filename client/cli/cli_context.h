#pragma once
// What every pagoda-cli command shares: the global flags and the exit code the
// command leaves for main().

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>

#include "connection_flags.h"
#include "pagoda/client/client.h"

namespace pagoda::client {

struct CliContext {
  ConnectionFlags connection;  // --server, --token, --tls*
  int64_t timeout_ms = 10000;  // deadline of each call; 0 = none
  int exit_code = 0;

  std::unique_ptr<Client> connect() const {
    ClientOptions base;
    base.timeout = std::chrono::milliseconds(timeout_ms);
    return connection.connect(base);
  }
};

// Prints the error to stderr and returns the exit code for a failed call (1).
int report_error(const Error& error);

}  // namespace pagoda::client
