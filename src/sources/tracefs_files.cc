// sources/tracefs_files.cc: finding tracefs (FindTracefs, mounting it when missing) and plain
// file I/O on it (ReadTracefsFile, WriteTracefsFile, and the helpers of
// tracefs_session_internal.h).
#include <dirent.h>
#include <fcntl.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>

#include "fmt/format.h"
#include "sources/tracefs_session.h"
#include "sources/tracefs_session_internal.h"

namespace exitscope::sources {
namespace tracefs_internal {

std::string Errno(int err) {
  return std::strerror(err);
}

bool Exists(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0;
}

bool IsDir(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

std::vector<std::string> ListDir(const std::string& path, bool dirs_only) {
  std::vector<std::string> out;
  DIR* d = ::opendir(path.c_str());
  if (!d) return out;
  while (dirent* e = ::readdir(d)) {
    if (e->d_name[0] == '.') continue;
    if (dirs_only && !IsDir(path + "/" + e->d_name)) continue;
    out.emplace_back(e->d_name);
  }
  ::closedir(d);
  std::sort(out.begin(), out.end());
  return out;
}

std::string Trim(std::string s) {
  while (!s.empty() && (s.back() == '\n' || s.back() == ' ')) s.pop_back();
  return s;
}

// Parses a decimal number that makes up all of `s`.
std::optional<uint64_t> ParseDecimal(std::string_view s) {
  if (s.empty() || s.size() > 19) return std::nullopt;
  uint64_t v = 0;
  for (const char c : s) {
    if (c < '0' || c > '9') return std::nullopt;
    v = v * 10 + static_cast<uint64_t>(c - '0');
  }
  return v;
}

}  // namespace tracefs_internal

using tracefs_internal::Errno;
using tracefs_internal::Exists;
using tracefs_internal::IsDir;

namespace {

constexpr long kTracefsMagic = 0x74726163;  // "trac": TRACEFS_MAGIC in linux/magic.h

}  // namespace

Result<std::string> ReadTracefsFile(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    const int err = errno;
    return Fail(err == EACCES || err == EPERM ? ErrorCode::kPermission : ErrorCode::kIo,
                fmt::format("{}: cannot open: {}", path, Errno(err)));
  }
  std::string out;
  char buf[4096];
  for (;;) {
    const ssize_t n = ::read(fd, buf, sizeof buf);
    if (n < 0) {
      if (errno == EINTR) continue;
      const int err = errno;
      ::close(fd);
      return Fail(ErrorCode::kIo, fmt::format("{}: read failed: {}", path, Errno(err)));
    }
    if (n == 0) break;
    out.append(buf, static_cast<size_t>(n));
  }
  ::close(fd);
  return out;
}

Status WriteTracefsFile(const std::string& path, const std::string& value) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_TRUNC | O_CLOEXEC);
  if (fd < 0) {
    const int err = errno;
    return Fail(err == EACCES || err == EPERM ? ErrorCode::kPermission : ErrorCode::kIo,
                fmt::format("{}: cannot open for writing: {}", path, Errno(err)));
  }
  ssize_t n = 0;
  if (!value.empty()) {
    do n = ::write(fd, value.data(), value.size());
    while (n < 0 && errno == EINTR);
  }
  const int err = errno;
  ::close(fd);
  if (n < 0) {
    return Fail(ErrorCode::kIo,
                fmt::format("{}: writing '{}' failed: {}", path, value, Errno(err)));
  }
  return {};
}

Result<std::string> FindTracefs(const std::string& dir_arg, bool mount_if_missing) {
  std::string dir = dir_arg;
  std::string origin;
  if (dir.empty()) {
    if (const char* env = std::getenv("EXITSCOPE_TRACEFS"); env && *env) {
      dir = env;
      origin = " (from EXITSCOPE_TRACEFS)";
    }
  }
  if (!dir.empty()) {
    if (!Exists(dir)) {
      return Fail(ErrorCode::kUnavailable,
                  fmt::format("tracefs not found at {}{}: point EXITSCOPE_TRACEFS at a mounted "
                              "tracefs, or mount one with `mount -t tracefs nodev {}` as root",
                              dir, origin, dir));
    }
  } else {
    dir = "/sys/kernel/tracing";
    struct statfs sfs;
    const bool mounted = ::statfs(dir.c_str(), &sfs) == 0 && sfs.f_type == kTracefsMagic;
    if (!mounted) {
      int err = ENOENT;
      if (IsDir(dir) && mount_if_missing) {
        if (::mount("nodev", dir.c_str(), "tracefs", 0, nullptr) == 0) return dir;
        err = errno;
      }
      if (Exists("/sys/kernel/debug/tracing/tracing_on")) return "/sys/kernel/debug/tracing";
      return Fail(err == EPERM || err == EACCES ? ErrorCode::kPermission : ErrorCode::kUnavailable,
                  fmt::format("tracefs not mounted at {} ({}): run `mount -t tracefs nodev {}` "
                              "as root",
                              dir, Errno(err), dir));
    }
  }
  const std::string probe = dir + "/tracing_on";
  if (::access(probe.c_str(), R_OK | W_OK) != 0) {
    const int err = errno;
    if (err == EACCES || err == EPERM || err == EROFS) {
      return Fail(ErrorCode::kPermission,
                  fmt::format("tracefs at {}{} is not writable for uid {} ({}): run as root "
                              "(e.g. `sudo exitscope kvm ...`)",
                              dir, origin, ::getuid(), Errno(err)));
    }
    return Fail(ErrorCode::kUnavailable,
                fmt::format("{}{} is not a tracefs mount (no tracing_on: {}): point "
                            "EXITSCOPE_TRACEFS at tracefs or run `mount -t tracefs nodev "
                            "/sys/kernel/tracing` as root",
                            dir, origin, Errno(err)));
  }
  return dir;
}

}  // namespace exitscope::sources
