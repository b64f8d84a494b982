// sources/kvm_input.h: opens a kvm trace file of any supported format (detected from its
// content, not its name) and streams it into a KvmPairer.
//
//   trace-cmd .dat (magic "\x17\x08\x44tracing": also what `exitscope kvm record` writes),
//   `trace-cmd report` text, the ftrace `trace` file, `perf script` text.
//
//   auto in = KvmInput::Open(path, {});                 // Result<std::unique_ptr<KvmInput>>
//   KvmPairer pairer({.clock = (*in)->scale()}, &sink);
//   Status s = (*in)->ReadAll(&pairer);
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "exitscope/status.h"
#include "sources/kvm_pairing.h"
#include "sources/trace_text.h"
#include "sources/tracecmd_dat.h"

namespace exitscope::sources {

struct KvmInputOptions {
  TextOptions text{};
  // TSC frequency for x86-tsc / counter clocks, kHz (0: this host's, see HostTscKhz()).
  uint64_t tsc_khz = 0;
};

class KvmInput {
 public:
  static Result<std::unique_ptr<KvmInput>> Open(const std::string& path,
                                                const KvmInputOptions& options);

  // "trace-cmd .dat", "trace-cmd report", "ftrace", "perf script".
  std::string format_name() const;
  const std::string& clock() const noexcept { return clock_; }
  // The conversion to nanoseconds for this capture's clock.
  ClockScale scale() const noexcept { return scale_; }
  // kHz used for a cycle clock (0 when the clock is in ns) and whether it is this host's.
  uint64_t tsc_khz() const noexcept { return tsc_khz_; }
  bool tsc_khz_from_host() const noexcept { return tsc_from_host_; }
  uint64_t lost_at_record() const noexcept { return dat_ ? dat_->lost_at_record_time() : 0; }

  Status ReadAll(KvmPairer* pairer);
  uint64_t records_read() const noexcept;
  // .dat only: the last ReadAll read CPU pages from the mapped file (TraceCmdDat).
  bool used_mapped_reader() const noexcept { return dat_ && dat_->used_mapped_reader(); }
  // .dat only: threads the last ReadAll read the CPU streams with (else 1).
  int read_threads() const noexcept { return dat_ ? dat_->read_threads() : 1; }
  // .dat only: time segments the last ReadAll cut, and how many a thread read and the
  // calling one took (TraceCmdDat::segments).
  uint64_t segments() const noexcept { return dat_ ? dat_->segments() : 0; }
  uint64_t verified_segments() const noexcept { return dat_ ? dat_->verified_segments() : 0; }

 private:
  KvmInput() = default;
  std::unique_ptr<TraceCmdDat> dat_;
  std::unique_ptr<TraceText> text_;
  std::string clock_;
  ClockScale scale_;
  uint64_t tsc_khz_ = 0;
  bool tsc_from_host_ = false;
};

}  // namespace exitscope::sources
