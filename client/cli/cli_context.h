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
  int exit_code = 0;

  std::unique_ptr<Client> connect() const {
    return Client::connect(server, ClientOptions{.timeout = std::chrono::milliseconds(timeout_ms)});
  }
};

// Prints the error to stderr and returns the exit code for a failed call (1).
int report_error(const Error& error);

}  // namespace pagoda::client
