#pragma once
// `pagoda-cli demo`: a short session against a server (create, append, decode
// with and without appended K/V, a batch of two, fork with copy-on-write, free),
// every output checked against the CLI's own double-precision reference.

#include <CLI/CLI.hpp>

#include "cli_context.h"

namespace pagoda::client {

void add_demo_command(CLI::App& app, CliContext& ctx);

}  // namespace pagoda::client
