// pagoda-bench: `kernel` times the backends in-process; `service` times the
// service over gRPC next to the in-process kernel on the same shape; `soak`
// runs many clients' mixed operations and verifies every token; `transfer`
// times ExportSequence/ImportSequence and a staged migration; `convert` times
// the host's dtype conversions every call runs.
#include <cstdlib>

#include <CLI/CLI.hpp>

#include "pagoda/heap_retention.h"

#include "convert_bench.h"
#include "kernel_bench.h"
#include "service_bench.h"
#include "soak_bench.h"
#include "transfer_bench.h"

int main(int argc, char** argv) {
  // As the server does: a client's per-call tensors must not time the
  // kernel's page faults (pagoda/heap_retention.h).
  pagoda::retain_freed_heap(std::getenv("GLIBC_TUNABLES"));
  CLI::App app{"pagoda-bench: kernel and service benchmarks (figures are ratios measured in one run)"};
  app.require_subcommand(1);
  int exit_code = 0;
  pagoda::bench::add_kernel_command(app);
  pagoda::bench::add_service_command(app, exit_code);
  pagoda::bench::add_soak_command(app, exit_code);
  pagoda::bench::add_transfer_command(app, exit_code);
  pagoda::bench::add_convert_command(app, exit_code);
  CLI11_PARSE(app, argc, argv);
  return exit_code;
}
