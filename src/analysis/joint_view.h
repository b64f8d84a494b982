// analysis/joint_view.h: one exit as the kernel and the VMM saw it (docs/joint.md).
//
// Input: two event streams (JointBuilder), the exits of a recorder dump's source (per vCPU,
// CLOCK_MONOTONIC ns converted from the TSC with the calibration the dump stores) and the
// userspace exits a KvmPairer emitted from a kernel trace recorded with trace_clock x86-tsc, their
// times left in raw TSC ticks (pair with the identity ClockScale). Both clocks are the same host's
// TSC, so the trace's ticks are converted with the dump's calibration (its frequency and its
// tick/ns base), never with
// --tsc-mhz or this host's frequency.
//
// Matching: each dump vCPU is given the kernel thread whose userspace exits contain most of
// that vCPU's exits (the dump stores no thread ids; see JointMapping). Then, per vCPU, a VMM
// exit [handler start, handler end] matches the kernel exit of its thread that contains it
// (within `tolerance_ns`); each kernel exit matches at most one VMM exit.
//
// Split of a matched exit (kernel start ks, kernel end ke, handler start hs, handler end he):
//   kernel_before = hs - ks   (exit, hand-off to userspace, VMM until its handler starts)
//   handler       = he - hs   (the dump's duration)
//   kernel_after  = ke - he   (handler end, KVM_RUN again, until guest entry)
// clamped at 0, so the three always sum to the kernel's duration exactly.
//
// Where the trace recorded sched:sched_switch (`kvm record -e kvm:* -e sched:sched_switch`),
// the time the vCPU thread was not running inside the exit is split out of each part:
//   before + handler + after + off_cpu = kernel, with before / handler / after the on-CPU
//   time of each part and off_cpu the time the thread was switched out (off_cpu_runnable of
//   it preempted but runnable: waiting for a host CPU; the rest sleeping or blocked).
// A thread is off-CPU from a sched_switch with prev_pid = its tid to the next one with
// next_pid = its tid; one first seen switching in was off since the trace began.
//
// Refusals (kInvalidArgument, one line): a trace clock other than x86-tsc, a dump clock
// other than the TSC, no overlap in time between the two, or fewer matches than
// `min_match_fraction` of the smaller side (e.g. a shifted TSC: exits no longer nest).
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "analysis/kept_event.h"
#include "exitscope/dump.h"
#include "exitscope/status.h"
#include "sources/event.h"
#include "sources/kvm_device_map.h"
#include "sources/source.h"

namespace exitscope::analysis {

struct JointOptions {
  // Slack when testing that a VMM exit lies inside a kernel exit (rounding of the dump's
  // ns <-> tick conversion).
  uint64_t tolerance_ns = 2;
  // Refuse when matched < min_match_fraction * min(VMM exits, kernel userspace exits).
  double min_match_fraction = 0.5;
  // Warn (JointView::warnings) below this fraction.
  double warn_match_fraction = 0.99;
};

// How dump vCPUs were tied to kernel threads.
enum class JointMapping : uint8_t {
  kThreadByTime,  // each vCPU -> the thread whose exits contain most of its exits
  kVcpuIndex,     // no vote possible: dump vCPU index == the kernel event's vcpu index
  kThreadId,      // the dump's thread ids (version 4 on), each found in the trace
};
std::string_view ToString(JointMapping m) noexcept;

struct JointVcpuThread {
  uint32_t vcpu = 0;
  uint32_t tid = 0;
  uint32_t kernel_vcpu = 0;  // the vcpu index the kernel source gave that thread
  uint64_t votes = 0;        // VMM exits of this vCPU that only this thread contains
};

// One exit seen from both sides. Times in CLOCK_MONOTONIC ns of the recording host.
struct JointExit {
  uint32_t vcpu = 0;
  uint32_t tid = 0;
  uint64_t kernel_start_ns = 0;
  uint64_t kernel_ns = 0;  // the kernel's duration: before + handler + after
  uint64_t handler_start_ns = 0;
  int64_t offset_ns = 0;  // handler start - kernel start
  uint64_t before_ns = 0;
  uint64_t handler_ns = 0;
  uint64_t after_ns = 0;
  // Only where JointView::sched_recorded: the thread was switched out for off_cpu_ns of the
  // exit (of which off_cpu_runnable_ns preempted); before/handler/after exclude it.
  uint64_t off_cpu_ns = 0;
  uint64_t off_cpu_runnable_ns = 0;
  uint64_t handler_wall_ns = 0;  // the VMM's handler time, on and off CPU (the dump's view)
  std::string kind;              // "PIO", "MMIO", ...
  std::string device;            // "nvme0", "" when unassigned
  std::string reg;               // "SQ1TDBL", "" when none
  std::string dir;               // "read", "write", ""
  std::string kernel_reason;     // the kernel's user_reason ("IO", "MMIO")

  // Only where JointView::sched_recorded: when the thread was switched out inside the exit
  // (CLOCK_MONOTONIC ns, in time order, clipped to the exit); they sum to off_cpu_ns.
  struct OffCpuSpan {
    uint64_t start_ns = 0, duration_ns = 0;
    bool runnable = false;  // preempted, not sleeping or blocked
  };
  std::vector<OffCpuSpan> off_cpu_spans;
};

// An exit one side saw and the other did not.
struct JointUnmatched {
  uint32_t vcpu = 0;
  uint32_t tid = 0;  // 0 when unknown (a VMM exit of an unmapped vCPU)
  uint64_t start_ns = 0;
  uint64_t duration_ns = 0;  // 0 when the side does not know it (open at end)
  std::string what;          // "PIO nvme0.SQ1TDBL write", "IO", ...
  std::string reason;        // why it has no partner (one of the k* strings below)
};

// Reasons, one spelling each (JSON and table use them as is).
inline constexpr const char* kReasonOpenAtEnd =
    "open at end of trace (the vCPU never re-entered the guest)";
inline constexpr const char* kReasonInProgress =
    "the VMM was still inside this exit when the dump was taken";
inline constexpr const char* kReasonBeforeDump =
    "before the dump's oldest exit of its vCPU (recorder not started or ring overwritten)";
inline constexpr const char* kReasonAfterDump = "after the dump was taken";
inline constexpr const char* kReasonBeforeTrace = "before the trace started";
inline constexpr const char* kReasonAfterTrace = "after the trace ended";
inline constexpr const char* kReasonNoKernelExit =
    "no kernel exit of its thread contains it (kernel records lost?)";
inline constexpr const char* kReasonNoVmmExit =
    "no VMM exit inside it (VMM record lost or skipped?)";
inline constexpr const char* kReasonUnmappedThread = "its thread runs no vCPU of the dump";
inline constexpr const char* kReasonUnmappedVcpu = "its vCPU has no kernel thread in the trace";

struct JointOffsetStats {
  int64_t min_ns = 0, median_ns = 0, max_ns = 0;
};

struct JointView {
  JointMapping mapping = JointMapping::kThreadByTime;
  std::vector<JointVcpuThread> threads;  // one per mapped dump vCPU
  uint64_t tsc_hz = 0;                   // the dump's TSC frequency, used for the trace's ticks
  uint64_t vmm_exits = 0;                // completed exits in the dump
  uint64_t kernel_exits = 0;             // userspace exits in the trace (open ones included)
  std::vector<JointExit> matched;        // in kernel start order
  std::vector<JointUnmatched> unmatched_vmm, unmatched_kernel;
  JointOffsetStats offset;
  std::vector<std::string> warnings;  // e.g. a low match fraction
  // The trace recorded sched:sched_switch: off_cpu_ns is split out of every matched exit.
  bool sched_recorded = false;
  uint64_t sched_switches = 0;  // sched_switch records used
  // Set by BuildJointViewFromTrace.
  std::string trace_format;         // "trace-cmd .dat", ...
  uint64_t kernel_lost_events = 0;  // records the trace's ring buffers lost
};

// One sched:sched_switch of the trace, its time in raw x86-tsc ticks.
struct SchedSwitch {
  uint64_t ts = 0;
  uint32_t prev_tid = 0;       // stops running
  uint32_t next_tid = 0;       // starts running
  bool prev_runnable = false;  // prev was preempted (state R), not sleeping or blocked
};

// The joint view built from two event streams (sources/source.h), the way every analysis
// consumes a source: feed the VMM's exits (a recorder dump's source: Side::kVmm, CLOCK_MONOTONIC
// ns, the exit a vCPU was inside at snapshot time with ExitEnd::kOpenAtEnd) to vmm(), the
// kernel's (a KvmPairer over a trace opened with JointTraceOptions: raw x86-tsc ticks) to
// kernel(), the trace's sched_switch records to OnSchedSwitch, then Finish. Every event is
// kept (owned) until Finish: matching needs both sides whole.
//
//   JointBuilder b(dump.clock);
//   dump_source.Run(b.vmm());
//   trace.ObserveRecords(&ObserveSched, &b);  // sched_switch, when the trace has them
//   trace.Run(b.kernel());
//   Result<JointView> view = b.Finish(trace.info().clock);
class JointBuilder {
 public:
  // `vmm_clock`: the calibration the VMM side's times were taken with (the dump's clock).
  explicit JointBuilder(const ClockCalibration& vmm_clock, JointOptions opts = {});
  JointBuilder(const JointBuilder&) = delete;
  JointBuilder& operator=(const JointBuilder&) = delete;

  // The VMM side: exits of Side::kVmm (device events, findings and kernel events ignored).
  EventSink* vmm() noexcept { return &vmm_; }
  // The kernel side: the userspace exits of a pairer (accesses handled in the kernel, exits
  // that never reached the VMM and exits with no traced end are ignored).
  EventSink* kernel() noexcept { return &kernel_; }
  // The VMM's thread of `vcpu` (the dump's DumpVcpu::tid). A vCPU whose thread has userspace
  // exits in the trace is matched on it; the others by time (JointMapping).
  void SetThreadId(uint32_t vcpu, uint32_t tid) { known_tids_[vcpu] = tid; }
  // One sched:sched_switch of the trace (any order; Finish sorts them by time).
  void OnSchedSwitch(const SchedSwitch& s) { sched_.push_back(s); }

  // Matches what was fed. `trace_clock` is the kernel capture's clock name. Errors:
  // kInvalidArgument with a one-line message (see the file comment).
  Result<JointView> Finish(const std::string& trace_clock);

 private:
  struct VmmVcpu {
    std::vector<KeptExit> exits;  // completed, in the dump's order
    bool in_progress = false;     // the vCPU was inside an exit when the dump was taken
    uint64_t in_progress_start_ns = 0;
  };
  // One side's inbox: forwards each exit to the builder's AddVmm or AddKernel.
  class SideSink final : public EventSink {
   public:
    SideSink(JointBuilder* b, void (JointBuilder::*add)(const ExitEvent&)) : b_(b), add_(add) {}
    void OnExit(const ExitEvent& e) override { (b_->*add_)(e); }

   private:
    JointBuilder* b_;
    void (JointBuilder::*add_)(const ExitEvent&);
  };
  void AddVmm(const ExitEvent& e);
  void AddKernel(const ExitEvent& e);

  ClockCalibration clock_;
  JointOptions opts_;
  std::map<uint32_t, uint32_t> known_tids_;  // vCPU -> tid (SetThreadId)
  SideSink vmm_{this, &JointBuilder::AddVmm};
  SideSink kernel_{this, &JointBuilder::AddKernel};
  std::map<uint32_t, VmmVcpu> vcpus_;  // by vCPU index
  std::vector<KeptExit> kernel_exits_;
  std::vector<SchedSwitch> sched_;
};

// The options a kernel trace is opened with for a joint view with `dump`: the dump's TSC
// frequency (never this host's: the trace's ticks are the dump host's), times kept in raw
// ticks (the builder converts them with the dump's calibration), the dump's device map
// (`devices`, may be null; it must outlive the source's Run).
sources::SourceOptions JointTraceOptions(const Dump& dump, const sources::KvmDeviceMap* devices);

// Runs both sources into a JointBuilder: `vmm` a recorder dump's source, `kernel` a trace
// opened with JointTraceOptions (its sched_switch records observed). Sets the view's
// trace_format and kernel_lost_events. Errors name both sources.
Result<JointView> BuildJointView(sources::Source& vmm, sources::Source& kernel,
                                 const JointOptions& opts = {});

// Opens `trace_path` (any format KvmInput reads) with JointTraceOptions (the device map read
// from `dump_path`, the file `dump` was read from), and builds the joint view of the two.
Result<JointView> BuildJointViewFromTrace(const Dump& dump, const std::string& dump_path,
                                          const std::string& trace_path,
                                          const JointOptions& opts = {});

// A dump in memory and kernel events already collected (tests): the dump's exits through its
// DumpSource, `kernel` (times in raw x86-tsc ticks) and `sched` (null: none recorded) fed to
// a JointBuilder.
Result<JointView> BuildJointView(const Dump& dump, const std::vector<ExitEvent>& kernel,
                                 const std::string& trace_clock, const JointOptions& opts = {},
                                 const std::vector<SchedSwitch>* sched = nullptr);

// Per-group aggregation of the matched exits: count and p50 / p99 of each part.
struct JointPart {
  uint64_t p50_ns = 0, p99_ns = 0;
  uint64_t sum_ns = 0;  // over the group's exits: the parts' sums add up to the total's
  double share_p50 = 0, share_p99 = 0;  // part / kernel duration, 0..1
};
struct JointGroup {
  std::string key;  // "PIO", "nvme0", "nvme0.SQ1TDBL write"
  uint64_t count = 0;
  JointPart total, before, handler, after, off_cpu;  // total: shares are 1
};
struct JointGroups {
  std::vector<JointGroup> by_kind, by_device, by_register;  // each sorted by count, desc
};
JointGroups GroupJointExits(const std::vector<JointExit>& exits);

// The `n` matched exits with the longest kernel duration, longest first.
std::vector<JointExit> SlowestJointExits(const std::vector<JointExit>& exits, size_t n);

}  // namespace exitscope::analysis
