#pragma once
// pagoda-server's command line: the flags of docs/design.md §5's table, each also read
// from the environment as PAGODA_ + its name upper-cased with '_' for '-'.

#include <CLI/App.hpp>

#include "app/server_config.h"

namespace pagoda {

// Registers every flag on `app`, writing into `config` (whose values are the defaults).
void add_server_flags(CLI::App& app, ServerConfig& config);

}  // namespace pagoda
