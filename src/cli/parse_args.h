// cli/parse_args.h: how every subcommand parses its flags and reports errors, so usage errors
// and exit statuses read the same everywhere (docs/development.md: one line naming the flag or
// input, exit status 0 ok, 1 runtime failure, 2 bad usage or bad input).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "CLI/CLI.hpp"
#include "exitscope/status.h"

namespace exitscope::cli {

// Parses argv into `app`. Returns std::nullopt to go on, or the exit status to return now:
// 0 after --help (printed on stdout), 2 after a usage error (one line
// "<argv[0]>: <what> (see --help)" on stderr). Every option that takes a value refuses an
// empty one ("--qmp ''" is a usage error, never "not given"). CLI11's own wording is never
// shown: a value that does not convert reads "--FLAG: 'VALUE' is not a number this flag
// accepts", a range it checks "--FLAG: 'VALUE' is out of range".
std::optional<int> ParseArgs(CLI::App& app, int argc, char** argv);

// The one-line message ParseArgs prints for CLI11's error text `what` (without the
// "(see --help)" tail): CLI11's raw wordings rephrased, anything else as it is.
std::string RephraseParseError(std::string_view what);

// The one mapping from an error to the process exit status: 2 when the user's input or
// usage is at fault (invalid argument, corrupt / unsupported / missing input, a conflicting
// registration), 1 for runtime failures (I/O, permission, a facility missing on this host,
// internal errors).
int ExitStatusFor(ErrorCode code) noexcept;

// Prints "<self>: <message>" on stderr and returns ExitStatusFor(e.code).
int ReportError(const char* self, const Error& e);
// Prints "<self>: <what>" on stderr and returns 2.
int UsageError(const char* self, std::string_view what);

// Writes a command's output (-o PATH) by the one output rule (base/output_file.h): "" or "-"
// is stdout; otherwise a new file renamed over PATH, which must be absent or a regular file
// (not a symlink, device, FIFO or directory). Errors name "-o PATH".
Status WriteOutput(const std::string& path, std::string_view text);

// Validators for numeric flags. CLI11's own NonNegativeNumber / PositiveNumber let NaN
// through (every comparison with NaN is false) and unsigned targets wrap "-5" around, so
// every numeric flag uses one of these: finite, and in range.
extern const CLI::Validator kFiniteNonNegative;   // 0 <= x < inf
extern const CLI::Validator kFinitePositive;      // 0 < x < inf
extern const CLI::Validator kNonNegativeInteger;  // an integer >= 0 (no sign, no fraction)

// A finite number in [lo, hi] `unit`, checked on the text as given, before the command
// converts it to its own unit (ms to ns, MHz to kHz), so no value wraps or saturates. Beyond
// it: "--FLAG: 'VALUE' is out of range: LO..HI UNIT".
CLI::Validator NumberIn(double lo, double hi, std::string_view unit);
// An integer (digits only) in [lo, hi] `unit`, checked before conversion as NumberIn.
CLI::Validator IntegerIn(uint64_t lo, uint64_t hi, std::string_view unit);

}  // namespace exitscope::cli
