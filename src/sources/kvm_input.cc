#include "sources/kvm_input.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include <fmt/format.h>

namespace exitscope::sources {

Result<std::unique_ptr<KvmInput>> KvmInput::Open(const std::string& path,
                                                 const KvmInputOptions& options) {
  if (path == "-") {
    return Fail(ErrorCode::kInvalidArgument,
                fmt::format("{}: reading a trace from standard input is not supported (streams "
                            "are not supported: save it to a file and pass its path)",
                            path));
  }
  // O_NONBLOCK: opening a FIFO must not wait for a writer.
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) {
    return Fail(errno == ENOENT ? ErrorCode::kInvalidArgument : ErrorCode::kIo,
                fmt::format("{}: cannot open: {}", path, std::strerror(errno)));
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
                fmt::format("{}: is a directory, not a trace file", path));
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    return Fail(ErrorCode::kInvalidArgument,
                fmt::format("{}: not a regular file: streams (pipes, FIFOs, devices, sockets) "
                            "are not supported: save the trace to a file first",
                            path));
  }
  char head[16] = {};
  const ssize_t n = ::pread(fd, head, sizeof(head), 0);
  ::close(fd);
  if (n <= 0) {
    return Fail(ErrorCode::kCorrupt, fmt::format("{}: offset 0: empty file", path));
  }
  std::unique_ptr<KvmInput> in(new KvmInput());
  if (LooksLikeTraceCmdDat(std::string_view(head, static_cast<size_t>(n))) ||
      (n >= 3 && head[0] == '\x17' && head[1] == '\x08' && head[2] == '\x44')) {
    auto dat = TraceCmdDat::Open(path);
    if (!dat) return Propagate(dat);
    in->dat_ = std::move(*dat);
    in->clock_ = in->dat_->clock();
  } else {
    auto text = TraceText::Open(path, options.text);
    if (!text) return Propagate(text);
    in->text_ = std::move(*text);
    in->clock_ = in->text_->clock();
  }
  if (in->clock_ == "x86-tsc" || in->clock_ == "counter") {
    in->tsc_khz_ = options.tsc_khz;
    if (in->tsc_khz_ == 0) {
      in->tsc_khz_ = HostTscKhz();
      in->tsc_from_host_ = true;
    }
    if (in->tsc_khz_ == 0) {
      return Fail(ErrorCode::kInvalidArgument,
                  fmt::format("{}: timestamps are {} cycles and this host's TSC frequency is "
                              "unknown: pass --tsc-mhz",
                              path, in->clock_));
    }
    in->scale_ = ClockScale::FromTscKhz(in->tsc_khz_);
  }
  return in;
}

std::string KvmInput::format_name() const {
  if (dat_) return "trace-cmd .dat";
  if (text_) return std::string(ToString(text_->flavor()));
  return "none";
}

Status KvmInput::ReadAll(KvmPairer* pairer) {
  if (dat_) return dat_->ReadAll(pairer);
  if (text_) return text_->ReadAll(pairer);
  return Fail(ErrorCode::kInternal, "KvmInput: nothing open");
}

uint64_t KvmInput::records_read() const noexcept {
  if (dat_) return dat_->records_read();
  if (text_) return text_->records_read();
  return 0;
}

}  // namespace exitscope::sources
