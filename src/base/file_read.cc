#include "base/file_read.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

namespace exitscope::base {

const char* FileTypeName(unsigned mode) noexcept {
  const mode_t m = static_cast<mode_t>(mode);
  return S_ISREG(m)    ? "a regular file"
         : S_ISLNK(m)  ? "a symlink"
         : S_ISDIR(m)  ? "a directory"
         : S_ISCHR(m)  ? "a character device"
         : S_ISBLK(m)  ? "a block device"
         : S_ISFIFO(m) ? "a FIFO or pipe"
         : S_ISSOCK(m) ? "a socket"
                       : "a special file";
}

Result<std::string> ReadBoundedFile(const std::string& path, uint64_t limit, std::string_view what,
                                    ErrorCode refused) {
  const std::string kind(what);
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) {
    const int err = errno;  // a file that is not there is bad input (exit status 2), not I/O
    return Fail(err == ENOENT || err == ENOTDIR ? ErrorCode::kNotFound : ErrorCode::kIo,
                path + ": cannot open " + kind + ": " + std::strerror(err));
  }
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    const int err = errno;
    ::close(fd);
    return Fail(ErrorCode::kIo, path + ": cannot stat " + kind + ": " + std::strerror(err));
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    return Fail(refused, path + ": is " + FileTypeName(st.st_mode) + ", not a regular file; " +
                             kind + "s are read from regular files only");
  }
  const auto size = static_cast<uint64_t>(st.st_size);
  if (size > limit) {
    ::close(fd);
    return Fail(refused, path + ": " + std::to_string(size) + " bytes is too large for a " + kind +
                             " (limit " + std::to_string(limit) + " bytes)");
  }
  // Read into the size fstat gave, then on in small pieces: a file that grew is read up to the
  // limit and never past it, a file that shrank gives what is there.
  std::string bytes;
  bytes.resize(static_cast<size_t>(size));
  size_t done = 0;
  char more[65536];
  for (;;) {
    const bool in_place = done < bytes.size();
    const size_t room = in_place ? bytes.size() - done : sizeof more;
    const ssize_t n = ::read(fd, in_place ? bytes.data() + done : more, room);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      const int err = errno;
      ::close(fd);
      return Fail(ErrorCode::kIo, path + ": read failed: " + std::strerror(err));
    }
    if (n == 0) break;
    if (!in_place) {
      if (done + static_cast<size_t>(n) > limit) {
        done = limit + 1;
        break;
      }
      bytes.append(more, static_cast<size_t>(n));
    }
    done += static_cast<size_t>(n);
  }
  ::close(fd);
  if (done > limit) {
    return Fail(refused, path + ": grew past " + std::to_string(limit) +
                             " bytes while being read; too large for a " + kind);
  }
  bytes.resize(done);
  return bytes;
}

}  // namespace exitscope::base
