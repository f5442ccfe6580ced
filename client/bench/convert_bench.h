#pragma once
// `pagoda-bench convert`: the host's bulk conversions and non-finite scan
// (pagoda/host_convert.h), which every Decode runs on its q and output and
// every append on its K/V, timed on a call-sized tensor against the element
// functions applied one at a time to the same data in the same run.

#include <CLI/CLI.hpp>

namespace pagoda::bench {

void add_convert_command(CLI::App& app, int& exit_code);

}  // namespace pagoda::bench
