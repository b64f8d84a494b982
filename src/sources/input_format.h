// sources/input_format.h: the one place an input file's format is sniffed from its first bytes.
//
//   auto format = SniffInputFile(path);  // checked: a regular, non-empty file
//   if (!format) return Propagate(format);
//   switch (*format) { case InputFormat::kDump: ...; case InputFormat::kTraceCmdDat: ...; }
//
// A recorder dump starts with its magic ("EXSCDUMP", exitscope/dump.h), a trace-cmd .dat
// with "\x17\x08\x44tracing" (its first three bytes are enough to call it one, so that a
// truncated .dat is reported by the .dat reader, not as bad text); anything else is text
// (ftrace / trace-cmd report / perf script lines, or a device map).
#pragma once

#include <string>
#include <string_view>

#include "exitscope/status.h"

namespace exitscope::sources {

enum class InputFormat { kDump, kTraceCmdDat, kText };

std::string_view ToString(InputFormat f) noexcept;

// The format of a file whose first bytes are `head`.
InputFormat SniffInputHead(std::string_view head) noexcept;

// Opens PATH without waiting (a FIFO has no writer to wait for), checks that it is a regular,
// non-empty file and sniffs its first bytes. Errors name the path: kNotFound (no such file),
// kInvalidArgument ("-", a directory, a pipe, FIFO, device or socket: streams are not
// supported), kCorrupt (empty), kIo.
Result<InputFormat> SniffInputFile(const std::string& path);

}  // namespace exitscope::sources
