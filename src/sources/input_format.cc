#include "sources/input_format.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include <fmt/format.h>

#include "exitscope/dump.h"

namespace exitscope::sources {

std::string_view ToString(InputFormat f) noexcept {
  switch (f) {
    case InputFormat::kDump:
      return "exitscope dump";
    case InputFormat::kTraceCmdDat:
      return "trace-cmd .dat";
    case InputFormat::kText:
      return "text";
  }
  return "?";
}

InputFormat SniffInputHead(std::string_view head) noexcept {
  if (head.starts_with(std::string_view(kDumpMagic, sizeof kDumpMagic))) return InputFormat::kDump;
  if (head.starts_with("\x17\x08\x44")) return InputFormat::kTraceCmdDat;
  return InputFormat::kText;
}

Result<InputFormat> SniffInputFile(const std::string& path) {
  if (path == "-") {
    return Fail(ErrorCode::kInvalidArgument,
                fmt::format("{}: reading standard input is not supported (streams are not "
                            "supported: save it to a file and pass its path)",
                            path));
  }
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) {
    const int err = errno;
    return Fail(err == ENOENT || err == ENOTDIR ? ErrorCode::kNotFound : ErrorCode::kIo,
                fmt::format("{}: cannot open: {}", path, std::strerror(err)));
  }
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    const int err = errno;
    ::close(fd);
    return Fail(ErrorCode::kIo, fmt::format("{}: cannot stat: {}", path, std::strerror(err)));
  }
  if (S_ISDIR(st.st_mode)) {
    ::close(fd);
    return Fail(ErrorCode::kInvalidArgument,
                fmt::format("{}: is a directory, not a regular file", path));
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    return Fail(ErrorCode::kInvalidArgument,
                fmt::format("{}: not a regular file: streams (pipes, FIFOs, devices, sockets) "
                            "are not supported: save it to a file first",
                            path));
  }
  char head[16] = {};
  const ssize_t n = ::pread(fd, head, sizeof(head), 0);
  const int err = errno;
  ::close(fd);
  if (n < 0)
    return Fail(ErrorCode::kIo, fmt::format("{}: read failed: {}", path, std::strerror(err)));
  if (n == 0) return Fail(ErrorCode::kCorrupt, fmt::format("{}: offset 0: empty file", path));
  return SniffInputHead(std::string_view(head, static_cast<size_t>(n)));
}

}  // namespace exitscope::sources
