// exitscope/status.h: the error type every fallible exitscope call returns.
//
// Fallible calls return `Result<T>` (std::expected<T, Error>). An Error carries a code the C
// API maps to an integer status and a one-line message that names the input (file, line,
// offset, flag) and what is wrong, fit to print as is. No exitscope API throws.
#pragma once

#include <expected>
#include <string>
#include <utility>

namespace exitscope {

enum class ErrorCode : int {
  kOk = 0,
  kInvalidArgument = 1,  // bad parameter or bad input (maps to CLI exit status 2)
  kAlreadyExists = 2,    // e.g. overlapping registration
  kNotFound = 3,
  kCorrupt = 4,      // malformed or truncated input file
  kUnsupported = 5,  // e.g. a dump from a future format version
  kIo = 6,           // open/read/write failure (errno in the message)
  kUnavailable = 7,  // a kernel facility missing here (/dev/kvm, tracefs)
  kPermission = 8,
  kInternal = 9,
};

struct Error {
  ErrorCode code = ErrorCode::kInternal;
  std::string message;
};

template <typename T>
using Result = std::expected<T, Error>;

// Status is Result<void>: `return {};` for success.
using Status = std::expected<void, Error>;

[[nodiscard]] inline std::unexpected<Error> Fail(ErrorCode code, std::string message) {
  return std::unexpected<Error>(Error{code, std::move(message)});
}

}  // namespace exitscope
