// sources/tracecmd_dat.h: reads kvm records from a trace-cmd .dat file through libtracecmd.
//
//   auto dat = TraceCmdDat::Open("trace.dat");          // validates header and CPU sections
//   if (!dat) { puts(dat.error().message.c_str()); }     // "trace.dat: offset 4096: ..."
//   KvmPairer pairer({.clock = ScaleFor((*dat)->clock())}, &sink);
//   Status s = (*dat)->ReadAll(&pairer);                 // time order over all CPUs
//
// Records are decoded with KvmTepDecoder straight from the ring-buffer pages libtracecmd
// hands out (tracecmd_iterate_events): no per-event object is built on our side. Lost events
// (kbuffer's missed-events count) are passed to the pairer; the per-CPU overrun counts the
// file carries (CPUSTAT option) are reported in lost_at_record_time().
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "exitscope/status.h"
#include "sources/kvm_pairing.h"
#include "sources/kvm_trace.h"

struct tracecmd_input;

namespace exitscope::sources {

// True when the file starts with trace-cmd's magic ("\x17\x08\x44tracing").
bool LooksLikeTraceCmdDat(std::string_view head) noexcept;

class TraceCmdDat {
 public:
  // Opens and validates `path`: magic, version, that libtracecmd can parse the headers, and
  // that every CPU's data section lies inside the file (a truncated capture is refused with
  // the offset where data is missing).
  static Result<std::unique_ptr<TraceCmdDat>> Open(const std::string& path);
  ~TraceCmdDat();
  TraceCmdDat(const TraceCmdDat&) = delete;
  TraceCmdDat& operator=(const TraceCmdDat&) = delete;

  // The trace clock the capture used ("x86-tsc", "local", ...); "local" when the file
  // does not say.
  const std::string& clock() const noexcept { return clock_; }
  int cpus() const noexcept { return cpus_; }
  // Overruns the kernel reported per CPU when the capture was taken (CPUSTAT "overrun:"),
  // summed: events lost before they reached the file.
  uint64_t lost_at_record_time() const noexcept { return lost_at_record_; }

  // Streams every record, in time order across CPUs, into `pairer` and calls Finish().
  // Records of other events are counted by the pairer as KvmEventType::kOther.
  Status ReadAll(KvmPairer* pairer);
  // Whether ReadAll may read CPU pages straight from the mapped file (default true; it
  // falls back to libtracecmd's iterator by itself when the file does not allow it), and
  // whether the last ReadAll did.
  void set_mapped_reader(bool allow) noexcept { allow_mapped_ = allow; }
  bool used_mapped_reader() const noexcept { return used_mapped_; }
  // Records seen by the last ReadAll, kvm or not.
  uint64_t records_read() const noexcept { return records_read_; }

 private:
  TraceCmdDat() = default;
  bool ReadMapped(KvmPairer* pairer, KvmTepDecoder* decoder, Status* status);
  Status CheckComplete(const KvmTepDecoder& decoder, const std::vector<uint64_t>& per_cpu,
                       const std::vector<uint64_t>& last_offset) const;
  bool allow_mapped_ = true;
  bool used_mapped_ = false;
  std::vector<uint64_t> per_cpu_read_;
  std::vector<uint64_t> last_offset_;
  std::string path_;
  tracecmd_input* handle_ = nullptr;
  std::string clock_ = "local";
  int cpus_ = 0;
  uint64_t lost_at_record_ = 0;
  uint64_t records_read_ = 0;
};

// The ClockScale for a trace clock name: identity for nanosecond clocks; for "x86-tsc" (and
// "counter"), cycles at `tsc_khz` kHz (0: the analysing host's TSC frequency, see
// HostTscKhz()).
ClockScale ScaleForClock(std::string_view clock, uint64_t tsc_khz = 0);
// The TSC frequency of this host in kHz: /sys/devices/system/cpu/cpu0/tsc_freq_khz, else
// the "tsc: Detected N MHz" / "Refined TSC" line of the kernel log via /proc/cpuinfo's
// "cpu MHz"; 0 when unknown.
uint64_t HostTscKhz();

}  // namespace exitscope::sources
