// base/file_read.h: reading a whole input file with its size checked first. Shared by the
// dump reader, register-map files and the layers above (device maps). Not public API.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "exitscope/status.h"

namespace exitscope::base {

// What a file of mode `mode` (st_mode) is, for messages: "a directory", "a symlink", "a FIFO or
// pipe", "a character device", ...
const char* FileTypeName(unsigned mode) noexcept;

// Reads PATH whole. Before any read it checks that PATH is a regular file (a directory, a
// device node such as /dev/zero, a FIFO or a socket is refused by name) of at most `limit`
// bytes, and it never reads past `limit` (the file may grow while it is read); a file that
// shrinks gives what is there. `what` names the kind of file in messages ("dump",
// "register map", "device map").
// Errors: kNotFound (no such file), kIo (open, stat or read failed), `refused` (not a regular
// file, or too large).
Result<std::string> ReadBoundedFile(const std::string& path, uint64_t limit, std::string_view what,
                                    ErrorCode refused);

}  // namespace exitscope::base
