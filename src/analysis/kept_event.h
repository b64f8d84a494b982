// analysis/kept_event.h: the owning copies of the events an analysis keeps past a sink call,
// and the one rule that says which exits are slow.
//
// A source's ExitEvent and Finding (sources/event.h) are views that live for one sink call.
// What an analysis lists beyond that (the slow, stalled and in-progress exits of a dump, the
// exits over kvm's --duration, the exits open at end of a kernel trace, the watchdog
// findings) is kept as a KeptExit / KeptFinding: the event itself with its strings owned (its
// views point into the kept object), and view() is the event, so every renderer and helper that
// reads an ExitEvent (TargetName, DescribeExit, FormatKvmSlowExit) reads a kept one too.
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
#include <optional>
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

// An exit kept past its sink call: the ExitEvent itself (sources/event.h says what each field
// means) with its strings (reason, device, reg, user_reason) owned by this object and its
// views pointing into them, plus the printed key of the report row it belongs to where the
// report has one (kvm report: "0x3f8:POUT"; empty elsewhere). A field added to ExitEvent is
// kept with no change here; only a new string field needs its storage below.
struct KeptExit : ExitEvent {
  std::string key;  // the report row's key text, when there is one

  KeptExit() = default;
  explicit KeptExit(const ExitEvent& e, std::string key = {});
  KeptExit(const KeptExit& o);
  KeptExit(KeptExit&& o) noexcept;
  KeptExit& operator=(const KeptExit& o);
  KeptExit& operator=(KeptExit&& o) noexcept;
  ~KeptExit() = default;

  // The event (its strings valid while this object lives, unchanged).
  const ExitEvent& view() const noexcept { return *this; }
  bool open_at_end() const noexcept { return end == ExitEnd::kOpenAtEnd; }
  bool stalled() const noexcept { return (flags & kExitFlagStalled) != 0; }

 private:
  void Own();  // copies what the views point at into the storage, and points them there
  void Repoint() noexcept;  // points the views at the storage (after a move)
  std::string reason_, device_, reg_, user_reason_;
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

// A watchdog finding kept past its sink call: the Finding itself with its strings (device,
// reg, text) and its stack owned by this object, and the I/Os in flight at its time.
struct KeptFinding : Finding {
  std::vector<InflightIo> in_flight;  // I/Os submitted and not completed at finding time,
                                      // as far as the device events still show them

  KeptFinding() = default;
  explicit KeptFinding(const Finding& f);
  KeptFinding(const KeptFinding& o);
  KeptFinding(KeptFinding&& o) noexcept;
  KeptFinding& operator=(const KeptFinding& o);
  KeptFinding& operator=(KeptFinding&& o) noexcept;
  ~KeptFinding() = default;

  // The finding, its strings pointing into this object.
  const Finding& view() const noexcept { return *this; }

 private:
  void Own();
  void Repoint() noexcept;
  std::string device_, reg_, text_;
  std::optional<ThreadStack> stack_;  // `stack` points here when the finding has one
};

}  // namespace exitscope::analysis
