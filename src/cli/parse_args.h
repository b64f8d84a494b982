// cli/parse_args.h: how every subcommand parses its flags, so usage errors read the same
// everywhere (DESIGN.md: one line naming the flag, exit status 2).
#pragma once

#include <optional>

#include "CLI/CLI.hpp"

namespace exitscope::cli {

// Parses argv into `app`. Returns std::nullopt to go on, or the exit status to return now:
// 0 after --help (printed on stdout), 2 after a usage error (one line
// "<argv[0]>: <what> (see --help)" on stderr).
std::optional<int> ParseArgs(CLI::App& app, int argc, char** argv);

}  // namespace exitscope::cli
