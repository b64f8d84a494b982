// sources/tracefs_session_internal.h: the small file-system helpers the tracefs session files
// share: tracefs_files.cc (finding tracefs, reading and writing its files: defines these),
// tracefs_settings.cc (snapshot and restore of a buffer's settings) and tracefs_session.cc (the
// session's events, buffer and lifetime). Not API.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace exitscope::sources::tracefs_internal {

// strerror(err).
std::string Errno(int err);

bool Exists(const std::string& path);
bool IsDir(const std::string& path);

// The names in `path` (no dot entries; only directories when `dirs_only`), sorted. Empty when
// `path` cannot be opened.
std::vector<std::string> ListDir(const std::string& path, bool dirs_only);

// `s` without trailing newlines and spaces.
std::string Trim(std::string s);

// Parses a decimal number that makes up all of `s`.
std::optional<uint64_t> ParseDecimal(std::string_view s);

}  // namespace exitscope::sources::tracefs_internal
