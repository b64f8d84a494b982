#include "base/output_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "base/file_read.h"  // FileTypeName

namespace exitscope::base {
namespace {

// Distinct temporary names for files opened at once by one process.
std::atomic<uint64_t> g_serial{0};

// Writes all of [data, data + n) to fd: at `offset` (pwrite), or where the file is (write) when
// offset is kAppendHere; retried on short writes and EINTR.
constexpr uint64_t kAppendHere = ~uint64_t{0};
Status WriteFully(int fd, const char* data, size_t n, uint64_t offset, const std::string& label) {
  size_t done = 0;
  while (done < n) {
    const ssize_t w = offset == kAppendHere
                          ? write(fd, data + done, n - done)
                          : pwrite(fd, data + done, n - done, static_cast<off_t>(offset + done));
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) {
      return Fail(ErrorCode::kIo,
                  label + ": write failed: " + std::strerror(w == 0 ? ENOSPC : errno));
    }
    done += static_cast<size_t>(w);
  }
  return {};
}

}  // namespace

std::string OutputFile::Label() const {
  return label_.empty() ? path_ : label_;
}

OutputFile::~OutputFile() {
  if (fd_ >= 0 && !stdout_) {
    close(fd_);
    unlink(tmp_.c_str());
  }
}

Status OutputFile::IoError(const char* what, int err) {
  if (!stdout_) {
    close(fd_);
    unlink(tmp_.c_str());
  }
  fd_ = -1;
  return Fail(ErrorCode::kIo, Label() + ": " + what + " failed: " + std::strerror(err));
}

Status OutputFile::Open(const std::string& path, const OutputOptions& options) {
  path_ = path;
  label_ = std::string(options.label);
  what_ = std::string(options.what);
  after_write_ = options.after_write;
  written_ = 0;
  if (path == "-" && options.allow_stdout) {
    stdout_ = true;
    fd_ = STDOUT_FILENO;
    return {};
  }
  target_ = path;
  struct stat st;
  if (lstat(path.c_str(), &st) == 0 && S_ISLNK(st.st_mode) && options.follow_symlink) {
    char resolved[PATH_MAX];
    if (realpath(path.c_str(), resolved) != nullptr) {
      target_ = resolved;
    } else if (errno == ENOENT) {  // a dangling link: its target is created
      char link[PATH_MAX];
      const ssize_t n = readlink(path.c_str(), link, sizeof link - 1);
      if (n <= 0) return Fail(ErrorCode::kIo, Label() + ": cannot read the symlink");
      link[n] = '\0';
      target_ = link[0] == '/' || path.rfind('/') == std::string::npos
                    ? std::string(link)
                    : path.substr(0, path.rfind('/') + 1) + link;
    } else {
      return Fail(ErrorCode::kIo,
                  Label() + ": cannot resolve the symlink: " + std::strerror(errno));
    }
  }
  const bool replaces = lstat(target_.c_str(), &st) == 0;
  if (replaces && !S_ISREG(st.st_mode)) {
    return Fail(ErrorCode::kInvalidArgument,
                Label() + ": exists and is " + FileTypeName(st.st_mode) + "; " + what_ +
                    " only replaces a regular file" +
                    (S_ISLNK(st.st_mode) ? " (name the file it points at)" : ""));
  }
  // New (O_EXCL) and never through a symlink planted at its name; beside the target so that
  // rename() is atomic.
  // PATH.tmp.PID first (what a killed writer leaves behind is recognisably its own), then
  // PATH.tmp.PID.N when that name is taken (another file being written, or a leftover of an
  // earlier process with this pid: never removed, it is not this writer's).
  for (int attempt = 0; attempt < 100; ++attempt) {
    tmp_ = target_ + ".tmp." + std::to_string(getpid());
    if (attempt > 0) tmp_ += "." + std::to_string(g_serial++);
    fd_ = open(tmp_.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC,
               static_cast<mode_t>(options.mode));
    if (fd_ >= 0 || errno != EEXIST) break;
  }
  if (fd_ < 0) return Fail(ErrorCode::kIo, Label() + ": cannot create: " + std::strerror(errno));
  if (replaces) fchmod(fd_, st.st_mode & 07777);  // best effort: the new file is ours either way
  end_ = 0;
  return {};
}

Status OutputFile::Write(std::string_view bytes) {
  if (fd_ < 0) return Fail(ErrorCode::kIo, Label() + ": write failed: file not open");
  const uint64_t at = stdout_ ? kAppendHere : end_;
  if (Status s = WriteFully(fd_, bytes.data(), bytes.size(), at, Label()); !s) return s;
  end_ += bytes.size();
  Written(bytes.size());
  return {};
}

// Not IoError on failure: other threads may be writing (the destructor closes and removes the
// file).
Status OutputFile::WriteAt(const void* data, size_t n, uint64_t offset) {
  if (fd_ < 0 || stdout_) return Fail(ErrorCode::kIo, Label() + ": write failed: file not open");
  if (Status s = WriteFully(fd_, static_cast<const char*>(data), n, offset, Label()); !s) return s;
  Written(n);
  return {};
}

void OutputFile::Written(uint64_t n) {
  const uint64_t total = written_.fetch_add(n, std::memory_order_relaxed) + n;
  if (after_write_ != nullptr) after_write_(total);
}

Status OutputFile::Commit() {
  if (fd_ < 0) return Fail(ErrorCode::kIo, Label() + ": write failed: file not open");
  if (stdout_) {
    fd_ = -1;
    return {};
  }
  if (fsync(fd_) != 0 && errno != EINVAL) return IoError("fsync", errno);
  if (close(fd_) != 0 && errno != EINTR) {
    fd_ = -1;
    const int err = errno;
    unlink(tmp_.c_str());
    return Fail(ErrorCode::kIo, Label() + ": close failed: " + std::strerror(err));
  }
  fd_ = -1;
  // Checked again just before the rename: the path may have changed since Open.
  struct stat st;
  if (lstat(target_.c_str(), &st) == 0 && !S_ISREG(st.st_mode)) {
    unlink(tmp_.c_str());
    return Fail(ErrorCode::kInvalidArgument, Label() + ": exists and is " +
                                                 FileTypeName(st.st_mode) + "; " + what_ +
                                                 " only replaces a regular file");
  }
  if (rename(tmp_.c_str(), target_.c_str()) != 0) {
    const int err = errno;
    unlink(tmp_.c_str());
    return Fail(ErrorCode::kIo, Label() + ": rename failed: " + std::strerror(err));
  }
  return {};
}

Result<std::FILE*> OpenLogFile(const std::string& path, const OutputOptions& options) {
  const std::string label = options.label.empty() ? path : std::string(options.label);
  struct stat st;
  int flags = O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC;
  if (lstat(path.c_str(), &st) == 0) {
    if (S_ISLNK(st.st_mode) && options.follow_symlink) {
      if (stat(path.c_str(), &st) != 0) st.st_mode = S_IFREG;  // dangling: the target is created
    }
    if (!S_ISREG(st.st_mode) && !S_ISCHR(st.st_mode)) {
      return Fail(ErrorCode::kInvalidArgument,
                  label + ": exists and is " + FileTypeName(st.st_mode) + "; " +
                      std::string(options.what) + " only replaces a regular file" +
                      (S_ISLNK(st.st_mode) ? " (name the file it points at)" : ""));
    }
  }
  if (!options.follow_symlink) flags |= O_NOFOLLOW;
  const int fd = open(path.c_str(), flags, 0666);
  std::FILE* f = fd < 0 ? nullptr : fdopen(fd, "w");
  if (f == nullptr) {
    const int err = errno;
    if (fd >= 0) close(fd);
    return Fail(ErrorCode::kIo, label + ": cannot create: " + std::strerror(err));
  }
  return f;
}

Status WriteOutputFile(const std::string& path, std::string_view bytes,
                       const OutputOptions& options) {
  OutputFile out;
  if (Status s = out.Open(path, options); !s) return s;
  if (Status s = out.Write(bytes); !s) return s;
  return out.Commit();
}

}  // namespace exitscope::base
