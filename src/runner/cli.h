// Command-line parsing for erun (Boost.Program_options). parse_cli() accepts
// horovodrun/mpirun habits (-np, -H, --hostfile, -x) and validates the whole
// set: a wrong or contradictory flag is one CliError line that says what is
// wrong and how to fix it; main prints it and exits with code 2.
#pragma once

#include <string>
#include <variant>

#include "runner/options.h"

namespace erun {

struct CliError {
  std::string message;
};
// --help or --version: text to print, exit 0.
struct CliInfo {
  std::string text;
};

// What main knows from the environment that changes the defaults.
struct CliContext {
  bool in_slurm_allocation = false;  // SLURM_JOB_ID is set
};

std::variant<DriverOptions, CliError, CliInfo> parse_cli(int argc, const char* const argv[],
                                                         const CliContext& context = {});

}  // namespace erun
