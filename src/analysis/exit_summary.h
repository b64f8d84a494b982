// analysis/exit_summary.h: what a recorder Dump (a file or a live Snapshot) says about exit
// health, aggregated per exit kind, device, register and vCPU, with the slow exits, the
// watchdog findings (each with the I/Os in flight at that moment) and every loss counter.
//
//   exitscope::analysis::ExitSummary s = exitscope::analysis::Summarize(dump, {});
//   for (const auto& g : s.by_register) printf("%s %llu\n", g.key.c_str(), g.stats.count());
//
// Group keys: kind "MMIO" / "PIO" / "HLT" ...; device "nvme0" or "unassigned"; register
// "nvme0.SQ1TDBL write" ("nvme0+0x2000 read" where no register covers the offset,
// "unassigned 0xdead0000 read" for unregistered addresses); vCPU "0", "1", ...
// Groups are sorted by total time, largest first.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "analysis/histogram.h"
#include "exitscope/dump.h"

namespace exitscope::analysis {

struct SummaryFilter {
  std::optional<uint32_t> vcpu;       // only this vCPU
  std::optional<std::string> device;  // only exits on this device ("unassigned" allowed)
};

struct ExitGroup {
  std::string key;
  LatencyStats stats;
};

// An exit worth a line of its own (slow, stalled, or still in progress at snapshot time).
struct NotableExit {
  DumpExit exit;
  std::string description;  // "exit MMIO write 4B to nvme0.SQ1TDBL (0xfebf1008)"
  bool in_progress = false;
};

struct InflightIo {
  uint32_t device = kUnassigned;
  std::string device_name;
  uint64_t io_id = 0;
  uint64_t submitted_ns = 0;
  uint64_t age_ns = 0;  // at the moment of the finding
};

struct FindingWithContext {
  FindingRecord finding;
  std::string device_name;
  std::vector<InflightIo> in_flight;  // I/Os submitted and not completed at finding time,
                                      // as far as the device-event ring still shows them
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
  std::vector<ExitGroup> by_kind;
  std::vector<ExitGroup> by_device;
  std::vector<ExitGroup> by_register;
  std::vector<ExitGroup> by_vcpu;
  std::vector<NotableExit> slow;  // slow or stalled exits, then in-progress ones; time order
  std::vector<FindingWithContext> findings;  // time order
  // Per-vCPU named counters from the embedder (e.g. KVM binary stats "kvm.exits"), summed
  // over the vCPUs that pass the filter.
  std::vector<std::pair<std::string, uint64_t>> vcpu_counters;
  LossCounters losses;
};

ExitSummary Summarize(const Dump& dump, const SummaryFilter& filter);

// "nvme0.SQ1TDBL", "nvme0+0x2000", "unassigned 0xdead0000" (no direction).
std::string ExitTarget(const Dump& dump, const DumpExit& e);

}  // namespace exitscope::analysis
