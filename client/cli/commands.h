#pragma once
// pagoda-cli's one-RPC commands: config, create, append, decode, fork, free,
// inspect, health.

#include <CLI/CLI.hpp>

#include "cli_context.h"

namespace pagoda::client {

void add_rpc_commands(CLI::App& app, CliContext& ctx);

}  // namespace pagoda::client
