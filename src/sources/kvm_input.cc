#include "sources/kvm_input.h"

#include <cerrno>
#include <cstring>

#include <fmt/format.h>

#include "sources/host_tsc.h"
#include "sources/input_format.h"

namespace exitscope::sources {

Result<std::unique_ptr<KvmInput>> KvmInput::Open(const std::string& path,
                                                 const KvmInputOptions& options) {
  auto format = SniffInputFile(path);
  if (!format) return Propagate(format);
  if (*format == InputFormat::kDump) {
    return Fail(ErrorCode::kInvalidArgument,
                fmt::format("{}: an exitscope dump (what a VMM recorded), not a kernel trace: "
                            "`exitscope inspect {}` reads it, `exitscope timeline` joins it with "
                            "a trace",
                            path, path));
  }
  std::unique_ptr<KvmInput> in(new KvmInput());
  if (*format == InputFormat::kTraceCmdDat) {
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
