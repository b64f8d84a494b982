// analysis/kept_event.h: the owning copies of the events an analysis keeps past a sink call,
// and the one rule that says which exits are slow.
//
// A source's ExitEvent and Finding (sources/event.h) are views that live for one sink call.
// What an analysis lists beyond that (the slow, stalled and in-progress exits of a dump, the
// exits over kvm's --duration, the exits open at end of a kernel trace, the watchdog
// findings) is kept as a KeptExit / KeptFinding: every field of the event, its strings owned,
// and view() gives the event back, so every renderer and helper that reads an ExitEvent
// (TargetName, DescribeExit, FormatKvmSlowExit) reads a kept one too.
//
//   analysis::SlowRule rule{.threshold_ns = 20'000};
//   if (rule.IsSlow(e)) kept.push_back(analysis::KeptExit(e, row_key));
//   report::FormatKvmSlowExit(kept.back().view(), kept.back().key);
//
// Slow and open exits are marked here, by the analysis: the recorder's flags in a dump
// (kExitFlagSlow, kExitFlagStalled) or a duration threshold (kvm's --duration), through
// SlowRule::IsSlow; an exit open at end (ExitEnd::kOpenAtEnd) is never slow, it is open. (The
// recorder's own log line for a slow exit is its public hook, exitscope/recorder.h SlowExit.)
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "sources/event.h"

namespace exitscope::analysis {

// Which exits are slow: those at least threshold_ns long (0: no threshold), and, with
// recorder_flags, those the recorder marked slow or the watchdog saw stuck (ExitEvent::flags
// kExitFlagSlow, kExitFlagStalled). Only an exit with a known time (ExitEnd::kSeen) is slow.
struct SlowRule {
  uint64_t threshold_ns = 0;
  bool recorder_flags = false;

  bool enabled() const noexcept { return threshold_ns != 0 || recorder_flags; }
  bool IsSlow(const ExitEvent& e) const noexcept {
    if (e.end != ExitEnd::kSeen) return false;
    return (threshold_ns != 0 && e.duration_ns >= threshold_ns) ||
           (recorder_flags && (e.flags & (kExitFlagSlow | kExitFlagStalled)) != 0);
  }
};

// An exit kept past its sink call: every ExitEvent field (sources/event.h says what each
// means), the strings owned, plus the printed key of the report row it belongs to where the
// report has one (kvm report: "0x3f8:POUT"; empty elsewhere).
struct KeptExit {
  uint64_t start_ns = 0;
  uint64_t duration_ns = 0;  // so far, for an exit in progress at snapshot time
  uint32_t vcpu = 0;
  uint32_t vm = 0;
  Isa isa = Isa::kUnknown;
  std::string reason;
  SubKeyKind subkey_kind = SubKeyKind::kNone;
  uint64_t subkey = 0;  // the port / address / MSR / hypercall ("addr" in inspect's JSON)
  uint8_t size = 0;
  AccessDir dir = AccessDir::kNone;
  bool userspace = false;
  std::string device;
  std::string reg;
  uint64_t device_offset = ExitEvent::kNoOffset;
  uint32_t tid = 0;
  uint64_t guest_rip = 0;
  uint64_t value = 0;
  std::string user_reason;
  bool failed_vmentry = false;
  ExitEnd end = ExitEnd::kSeen;  // kOpenAtEnd: open at end of trace / in progress in a dump
  bool kernel_access = false;
  ExitKind kind = ExitKind::kUnknown;
  uint8_t flags = 0;  // the recorder's ExitFlags
  std::string key;    // the report row's key text, when there is one

  KeptExit() = default;
  explicit KeptExit(const ExitEvent& e, std::string key = {});
  // The event, its strings pointing into this object (valid while it lives, unchanged).
  ExitEvent view() const noexcept;

  bool open_at_end() const noexcept { return end == ExitEnd::kOpenAtEnd; }
  bool stalled() const noexcept { return (flags & kExitFlagStalled) != 0; }
};

// A dump exit in words: "exit MMIO write 4B to nvme0.SQ1TDBL (0xfebf1008)", "exit HLT".
std::string DescribeExit(const KeptExit& e);

// An I/O submitted and not completed at a finding's time.
struct InflightIo {
  std::string device_name;
  uint64_t io_id = 0;
  uint64_t submitted_ns = 0;
  uint64_t age_ns = 0;  // at the moment of the finding
};

// A watchdog finding kept past its sink call: every Finding field, the strings owned, and the
// I/Os in flight at its time.
struct KeptFinding {
  uint64_t time_ns = 0;
  FindingType type = FindingType::kStuckExitBegin;
  uint32_t vcpu = 0;
  uint64_t duration_ns = 0;
  std::string device;
  std::string reg;
  uint64_t io_id = 0;
  std::string text;
  std::vector<InflightIo> in_flight;  // I/Os submitted and not completed at finding time,
                                      // as far as the device events still show them

  KeptFinding() = default;
  explicit KeptFinding(const Finding& f);
  // The finding, its strings pointing into this object.
  Finding view() const noexcept;
};

}  // namespace exitscope::analysis
