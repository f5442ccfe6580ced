#pragma once
// `pagoda-bench transfer`: ExportSequence and ImportSequence throughput over
// gRPC between two running servers, each divided by a memcpy of the same bytes
// in the same run; and a staged migration's downtime while a client appends
// to the sequence every --append-every-ms.

#include <CLI/CLI.hpp>

namespace pagoda::bench {

void add_transfer_command(CLI::App& app, int& exit_code);

}  // namespace pagoda::bench
