// base/output_file.h: the one rule for every file exitscope writes (dumps, reports, timelines,
// recordings, the serial log).
//
//   - PATH "-" is stdout: written in place, never closed or removed.
//   - Otherwise the bytes go to a new temporary file beside PATH (O_EXCL, not through a symlink
//     planted at its name), and Commit renames it over PATH after fsync: a reader never sees
//     half a file, and a failed or abandoned write leaves PATH as it was. The only file ever
//     removed is that temporary file, which this writer created.
//   - PATH must be absent or a regular file. A device node (/dev/null, /dev/full), FIFO,
//     socket or directory is refused, and so is a symlink unless `follow_symlink` is set (the
//     rule then applies to the file the link points at, and the link stays).
//
//   base::OutputFile out;
//   if (Status s = out.Open(path, {.what = "a report"}); !s) return s;
//   if (Status s = out.Write(text); !s) return s;
//   return out.Commit();
//
// Not public API (the recorder's dump writer uses it through recorder/dump_file.h).
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <string>
#include <string_view>

#include "exitscope/status.h"

namespace exitscope::base {

struct OutputOptions {
  // How messages name the path ("-o out.html"); empty: the path itself.
  std::string_view label = {};
  // What is written, for the refusal ("a dump" only replaces a regular file).
  std::string_view what = "an output";
  bool follow_symlink = false;
  // "-" means stdout; when false, "-" is a file named "-" (dumps: they are written at offsets).
  bool allow_stdout = true;
  // The new file's mode, less the umask (dumps: 0640, they may hold guest data). A regular
  // file that is replaced keeps its own mode.
  unsigned mode = 0666;
  // Test-only: called after each write into the temporary file with the bytes written into
  // it so far (the fault matrix stops a writer at a chosen point this way).
  void (*after_write)(uint64_t written) = nullptr;
};

class OutputFile {
 public:
  OutputFile() = default;
  // Not committed: the temporary file is closed and removed; PATH is untouched.
  ~OutputFile();
  OutputFile(const OutputFile&) = delete;
  OutputFile& operator=(const OutputFile&) = delete;

  // Errors: kInvalidArgument (PATH exists and is not a regular file, or is a symlink without
  // follow_symlink), kIo (the temporary file cannot be created).
  Status Open(const std::string& path, const OutputOptions& options = {});
  // Appends (stdout: writes) all of `bytes`, retried on short writes and EINTR.
  Status Write(std::string_view bytes);
  // Writes all of [data, data + n) at `offset` (pwrite). Several threads may write at once
  // (disjoint ranges); a failure leaves the file open for them. Not for stdout.
  Status WriteAt(const void* data, size_t n, uint64_t offset);
  // fsync, then rename over PATH (checked again: it may have changed since Open). stdout:
  // flushed only.
  Status Commit();

  bool is_stdout() const noexcept { return stdout_; }
  // The file descriptor being written (-1 before Open and after Commit).
  int fd() const noexcept { return fd_; }
  // The path as given to Open.
  const std::string& path() const noexcept { return path_; }

 private:
  Status IoError(const char* what, int err);
  void Written(uint64_t n);
  std::string Label() const;
  std::string path_;    // as given
  std::string target_;  // what the rename replaces (the link's target with follow_symlink)
  std::string tmp_;
  std::string label_, what_;
  int fd_ = -1;
  uint64_t end_ = 0;                  // Write's offset
  std::atomic<uint64_t> written_{0};  // bytes written so far, by every thread (after_write)
  void (*after_write_)(uint64_t) = nullptr;
  bool stdout_ = false;
};

// A log written as it happens (the guest's serial output): the same refusals as OutputFile
// (a symlink only with follow_symlink; no FIFO, socket or directory), but written in place
// (truncated, O_NOFOLLOW) so that it can be followed while it grows and keeps what was written
// if the process is killed; a character device (/dev/null, a tty) is written as it is, never
// removed. "-" is not special here. The caller fcloses the stream.
Result<std::FILE*> OpenLogFile(const std::string& path, const OutputOptions& options = {});

// Open, Write, Commit in one call.
Status WriteOutputFile(const std::string& path, std::string_view bytes,
                       const OutputOptions& options = {});

}  // namespace exitscope::base
