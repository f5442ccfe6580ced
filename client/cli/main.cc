// pagoda-cli: a command-line client of the pagoda decode-attention service.
#include <cstdlib>
#include <iostream>

#include <CLI/CLI.hpp>

#include "cli_context.h"
#include "commands.h"
#include "demo.h"
#include "pagoda/heap_retention.h"

namespace pagoda::client {

int report_error(const Error& error) {
  std::cerr << "error: " << error.to_string() << "\n";
  return 1;
}

}  // namespace pagoda::client

int main(int argc, char** argv) {
  pagoda::retain_freed_heap(std::getenv("GLIBC_TUNABLES"));  // tensors every call (pagoda/heap_retention.h)
  pagoda::client::CliContext ctx;
  CLI::App app{"pagoda-cli: client of the pagoda decode-attention service (pagoda.v1)"};
  app.require_subcommand(1);
  // The connection flags may come after the command too: `migrate --server A --seq ID --to B`.
  app.fallthrough();
  ctx.connection.add_to(app);
  app.add_option("--timeout-ms", ctx.timeout_ms, "Deadline of each call in milliseconds (0 = none)")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  pagoda::client::add_rpc_commands(app, ctx);
  pagoda::client::add_demo_command(app, ctx);
  CLI11_PARSE(app, argc, argv);
  return ctx.exit_code;
}
