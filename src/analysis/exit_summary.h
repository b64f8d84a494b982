// analysis/exit_summary.h: what a recorder Dump (a file or a live Snapshot) says about exit
// health, aggregated per exit kind, device, register and vCPU, with the slow exits, the
// watchdog findings (each with the I/Os in flight at that moment) and every loss counter.
//
// The summary is an EventSink (ExitSummaryBuilder) fed by the dump's event stream
// (sources::DumpSource); its tables are rows of the one grouping engine (exit_table.h), the
// same rows the kvm tables are made of. Summarize(dump) is DumpSource -> builder, plus the
// dump's counters (losses, the embedder's per-vCPU counters), which are no events.
//
//   exitscope::analysis::ExitSummary s = exitscope::analysis::Summarize(dump, {});
//   for (const auto& r : s.by_register.rows) printf("%s %llu\n", r->key.c_str(), r->stats.count());
//
// Group keys (ExitKey of exit_table.h): kind "MMIO" / "PIO" / "HLT" ...; device "nvme0" or
// "unassigned"; register "nvme0.SQ1TDBL write" ("nvme0+0x2000 read" where no register covers
// the offset, "unassigned 0xdead0000 read" for unregistered addresses); vCPU "0", "1", ...
// Rows are sorted by total time, largest first (ties by key); vCPUs by number.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "analysis/exit_table.h"
#include "analysis/kept_event.h"
#include "base/histogram.h"
#include "exitscope/dump.h"
#include "sources/event.h"

namespace exitscope::analysis {

using base::LatencyHistogram;  // base/histogram.h
using base::LatencyStats;

struct SummaryFilter {
  std::optional<uint32_t> vcpu;       // only this vCPU
  std::optional<std::string> device;  // only exits on this device ("unassigned" allowed: every
                                      // exit with no device, HLT and the like included)
};

// Losses: nothing is dropped silently.
struct LossCounters {
  uint64_t exits_written = 0;
  uint64_t exits_overwritten = 0;  // oldest records overwritten by newer ones
  uint64_t exits_skipped = 0;      // torn while a snapshot copied them
  uint64_t device_events_written = 0;
  uint64_t device_events_overwritten = 0;
  uint64_t device_events_dropped = 0;
  uint64_t device_events_skipped = 0;
  uint64_t findings_dropped = 0;
  uint64_t bad_vcpu = 0;
  uint64_t end_without_begin = 0;
  uint64_t begin_without_end = 0;
  uint64_t io_inflight_overflow = 0;
};

struct ExitSummary {
  uint64_t exits = 0;     // exits that passed the filter
  uint64_t total_ns = 0;  // their summed duration
  uint64_t first_ns = 0;  // start of the first exit
  uint64_t last_ns = 0;   // end of the last exit
  double span_s() const noexcept { return last_ns > first_ns ? (last_ns - first_ns) / 1e9 : 0.0; }
  LatencyStats all;
  ExitTable by_kind;
  ExitTable by_device;
  ExitTable by_register;
  ExitTable by_vcpu;
  // Slow or stalled exits (SlowRule with recorder_flags) and exits in progress at snapshot
  // time (end == kOpenAtEnd, duration_ns so far); time order.
  std::vector<KeptExit> slow;
  std::vector<KeptFinding> findings;  // time order, each with the I/Os in flight
  // Per-vCPU named counters from the embedder (e.g. KVM binary stats "kvm.exits"), summed
  // over the vCPUs that pass the filter.
  std::vector<std::pair<std::string, uint64_t>> vcpu_counters;
  LossCounters losses;
};

// The slow exits of a dump: those the recorder marked slow (at its threshold) or the watchdog
// saw stuck (ExitEvent::flags).
inline constexpr SlowRule kDumpSlowRule{.recorder_flags = true};

// The summary of one event stream: every exit (ExitEnd::kSeen) into the tables; slow or
// stalled exits (kDumpSlowRule) and exits open at end into
// `slow`; findings with the I/Os in flight, replayed from the I/O submit / complete device
// events.
class ExitSummaryBuilder final : public EventSink {
 public:
  explicit ExitSummaryBuilder(SummaryFilter filter);
  void OnExit(const ExitEvent& e) override;
  void OnDeviceEvent(const DeviceEvent& e) override;
  void OnFinding(const Finding& f) override;
  // Sorts the tables and lists, matches findings with I/Os; call once, after the source.
  ExitSummary Finish();

 private:
  bool PassesDevice(std::string_view device) const;
  struct Io {
    uint64_t time_ns;
    bool submit;
    std::string device;
    uint64_t io_id;
  };

  SummaryFilter filter_;
  ExitSummary s_;
  ExitGrouper kinds_{&s_.by_kind}, devices_{&s_.by_device}, registers_{&s_.by_register},
      vcpus_{&s_.by_vcpu};
  std::string scratch_;
  bool first_ = true;
  std::vector<Io> ios_;
};

// `also`, when given, receives every event of the dump's stream too (the HTML report's plots
// are drawn from the same stream the tables are counted from).
ExitSummary Summarize(const Dump& dump, const SummaryFilter& filter, EventSink* also = nullptr);

}  // namespace exitscope::analysis
