#pragma once
// `pagoda-bench service`: Decode latency and throughput over gRPC with N
// concurrent clients, unary and/or streaming, next to GetConfig (the bare round
// trip) and the in-process kernel on the same shape.

#include <CLI/CLI.hpp>

namespace pagoda::bench {

// Registers the subcommand; its exit code (0, or 1 on any failed call) goes to
// `exit_code` when it runs.
void add_service_command(CLI::App& app, int& exit_code);

}  // namespace pagoda::bench
