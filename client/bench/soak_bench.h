#pragma once
// `pagoda-bench soak`: N clients x M mixed operations against a running server
// (see soak_workload.h), every operation counted by outcome, then every
// sequence's lengths and a decode of each layer verified against what the
// clients appended. With --sigterm-after, the server (--server-pid) is sent
// SIGTERM mid-run: every call must then complete or be refused UNAVAILABLE.

#include <CLI/CLI.hpp>

namespace pagoda::bench {

// Registers the subcommand; its exit code (0 when nothing was lost, doubled,
// mismatched or failed) goes to `exit_code` when it runs.
void add_soak_command(CLI::App& app, int& exit_code);

}  // namespace pagoda::bench
