// report/timeline.h: the exit timeline in the Trace Event JSON format that ui.perfetto.dev and
// chrome://tracing open (docs/timeline.md), written while the events arrive: it is an
// EventSink, so a recorder dump (sources::DumpSource), a kernel trace (KvmInput -> KvmPairer)
// and the joint view of both all reach it through the one event stream.
//
//   TimelineWriter w(out, {.base_ns = first_ns, .vm = pid});
//   w.NameVm(pid, "exitscope (pid 1234)");
//   sources::DumpSource(dump).Emit(&w);      // VMM exits, device events, findings
//   pairer = KvmPairer({...}, w.kernel_sink());  // or a kernel trace's exits
//   Status s = w.Finish(dump.monotonic_ns);
//
// What it writes (pid = the VM, tid = the vCPU; ts / dur in microseconds with three decimals,
// so nanoseconds are exact; "displayTimeUnit": "ns"):
//   - one "X" slice per exit on its vCPU's track, named by kind and device.register
//     ("mmio nvme0.SQ1TDBL", "pio uart0.LSR", "hlt"; a kernel exit by its reason, cat
//     "kernel"), args address, size, duration_ns, dir, value (only when the dump carries
//     guest data), slow / stalled / in_progress;
//   - device I/O as async slices ("b" / "e", cat = the device, id = the io id) from submit to
//     complete; one still in flight at the end closes at Finish's end_ns (in_flight_at_end);
//   - "i" instants for queue-full, backend errors, notes and watchdog findings (on the vCPU's
//     track when the finding has one, else on the VM's);
//   - in the joint view (SetJointView), each matched exit as nested slices: the kernel exit,
//     inside it "kernel before", the VMM's exit (the handler) and "kernel after", and inside
//     those the off-CPU spans where the trace recorded sched_switch.
//   - `kvm stat --bpf --stacks`'s slow exits seen from the kernel (DrawOffCpuExits): one slice
//     per exit on its thread's track (pid = the VMM, tid = the thread, cat "kernel-seen"),
//     inside it one slice per place the thread went off the CPU (cat "off-cpu"), its args
//     the kernel and user frames. The program keeps each place's total time, not when: the
//     places are laid one after the other from the exit's start, longest first
//     (args.laid_out says so).
//
// Slices on one track never overlap: exits of one vCPU arrive in time order (EventSink's
// contract) and a slice that starts before the previous one on its track ended is clamped to
// start at that end (args.clamped_ns says by how much; stats().clamped counts them).
//
// Memory: constant per exit for a dump or a trace alone (only the I/Os in flight are kept).
// The joint view keeps its exits until Finish, to draw each vCPU's VMM and kernel exits in one
// time order (the JointView holds them all anyway).
#pragma once

#include <cstdint>
#include <cstdio>
#include <limits>
#include <map>
#include <set>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "analysis/joint_view.h"
#include "analysis/offcpu_exits.h"
#include "exitscope/dump.h"
#include "exitscope/status.h"
#include "sources/event.h"
#include "sources/source.h"

namespace exitscope::report {

struct TimelineOptions {
  // The time written as ts 0 (CLOCK_MONOTONIC ns of the capture, or the trace's clock); earlier
  // times are written as 0. Rebasing keeps ts small enough for a double to hold every ns.
  uint64_t base_ns = 0;
  // The VM (pid) that device events and findings belong to (a dump's process).
  uint32_t vm = 0;
  // Exits that start in [from_ns, to_ns) after base_ns, and device events / findings there.
  uint64_t from_ns = 0;
  uint64_t to_ns = std::numeric_limits<uint64_t>::max();
  // Only exits at least this long (the kernel's duration for a joint exit).
  uint64_t min_duration_ns = 0;
  // Only exits of this vCPU, and of this VM (pid) or vCPU thread (tid); -1: all (kvm report's
  // --vcpu and -p, as the analysis applies them).
  int64_t only_vcpu = -1;
  int64_t only_pid = -1;
  // At most this many exit slices in the file (0 = all). A trace's exits arrive in time order:
  // the first max_exits are kept. A dump's vCPUs come one after the other, so WriteTimeline
  // gives each vCPU a share in proportion to its exits (SetVcpuQuota): the first of each.
  uint64_t max_exits = 0;
  // Written into "otherData" (source file names, clock, ...).
  std::vector<std::pair<std::string, std::string>> other_data;
};

struct TimelineStats {
  uint64_t vmm_exits = 0;     // exit slices of a dump (joint ones included)
  uint64_t kernel_exits = 0;  // kernel exit slices of a trace (joint parents included)
  uint64_t joint_exits = 0;   // exits drawn split (kernel before / handler / kernel after)
  uint64_t off_cpu_spans = 0;
  uint64_t left_out = 0;   // exits outside the window, shorter than min_duration_ns, or
                           // not of only_vcpu / only_pid
  uint64_t capped = 0;     // exits left out by max_exits
  uint64_t not_drawn = 0;  // kernel exits with no known duration (open at end, not traced)
  uint64_t clamped = 0;    // slices clamped to not overlap the previous one on their track
  uint64_t io_slices = 0;
  uint64_t io_in_flight_at_end = 0;
  uint64_t io_completions_unpaired = 0;  // completions whose submit the capture lacks
  uint64_t instants = 0;
  uint64_t offcpu_exits = 0;  // kernel-seen slow exits drawn (DrawOffCpuExits)
  uint64_t offcpu_sites = 0;  // their off-CPU places drawn inside them
  uint64_t bytes = 0;         // of the whole file
};

class TimelineWriter : public EventSink {
 public:
  // `out` is not owned; nothing is written to it before the first event.
  TimelineWriter(std::FILE* out, TimelineOptions options);
  TimelineWriter(const TimelineWriter&) = delete;
  TimelineWriter& operator=(const TimelineWriter&) = delete;

  // Sets base_ns; only before the first event is written.
  void SetBase(uint64_t base_ns) noexcept { opts_.base_ns = base_ns; }
  // At most `n` exit slices on vCPU `vcpu`'s tracks (replaces max_exits for it).
  void SetVcpuQuota(uint32_t vcpu, uint64_t n) { quota_[vcpu] = n; }
  // Names VM `vm`'s process ("exitscope (pid 1234)"); without it: "pid <vm>".
  void NameVm(uint32_t vm, std::string_view name);
  // Names a track other than "vCPU <tid>" (e.g. a kernel thread that runs no vCPU of a dump).
  void NameTrack(uint32_t vm, uint32_t tid, std::string_view name);
  // The joint view: `view` (outliving the writer) says which VMM exit (vcpu, handler start)
  // and which kernel exit (vcpu, kernel start, in the dump's ns) are one exit. Call before
  // any exit; the kernel sink then takes exits with times in the dump's ns and vcpu = the
  // dump's vCPU.
  void SetJointView(const analysis::JointView* view);

  // A VMM exit (a dump's: sources::DumpSource), device event or finding.
  void OnExit(const ExitEvent& e) override;
  void OnDeviceEvent(const DeviceEvent& d) override;
  void OnFinding(const Finding& f) override;
  // Takes a kernel trace's exits (a KvmPairer's sink): userspace and in-kernel exits alike;
  // kernel accesses (no exit record) and exits of unknown duration are counted, not drawn.
  EventSink* kernel_sink() noexcept { return &kernel_; }
  // The slow exits seen from the kernel with their off-CPU places (`kvm stat --bpf --stacks`),
  // in CLOCK_MONOTONIC ns: each thread's track named "thread <tid>" unless named already.
  void DrawOffCpuExits(const analysis::OffCpuSlowExits& s);

  // Draws what the joint view kept, closes the I/Os still in flight at `end_ns`, writes the
  // trailer and flushes. kIo on a write error.
  Status Finish(uint64_t end_ns);
  const TimelineStats& stats() const noexcept { return stats_; }

 private:
  class KernelSink : public EventSink {
   public:
    explicit KernelSink(TimelineWriter* w) : w_(w) {}
    void OnExit(const ExitEvent& e) override { w_->OnKernelExit(e); }

   private:
    TimelineWriter* w_;
  };
  struct Track {
    uint64_t last_end = 0;  // absolute ns
    uint64_t exits = 0;
  };
  struct OpenIo {
    uint64_t start_ns = 0;
    bool written = false;  // its "b" is in the file (not left out by the window)
  };
  struct Kept {
    ExitEvent e;
    bool kernel = false;
    uint64_t draw_start = 0;
  };

  void OnKernelExit(const ExitEvent& e);
  void DrawVmmExit(const ExitEvent& e);
  void DrawKernelExit(const ExitEvent& e);
  void DrawJointExit(const ExitEvent& e, const analysis::JointExit& j);
  // Whether an exit [start, start + dur) on (vm, vcpu) is drawn; counts it either way.
  bool Admit(uint32_t vm, uint32_t vcpu, uint64_t start, uint64_t dur);
  bool Selected(const ExitEvent& e) const noexcept;  // only_vcpu, only_pid
  // Clamps [*start, *start + *dur) to begin at the track's last end; returns the clamp.
  uint64_t Clamp(Track& t, uint64_t* start, uint64_t* dur);
  Track& TrackOf(uint32_t vm, uint32_t tid);
  void Process(uint32_t vm);
  void BeginEvent();
  bool InWindow(uint64_t abs_ns) const noexcept;
  void Ts(uint64_t abs_ns);
  void Dur(uint64_t ns);
  void Slice(uint32_t vm, uint32_t tid, uint64_t start, uint64_t dur, std::string_view name,
             std::string_view cat);  // opens args: the caller appends fields and CloseArgs()
  void CloseArgs();
  void Instant(uint32_t vm, uint32_t tid, bool thread_scope, uint64_t t, std::string_view name,
               std::string_view cat);  // opens args likewise
  void Flush();

  std::FILE* out_;
  TimelineOptions opts_;
  TimelineStats stats_;
  KernelSink kernel_{this};
  std::string buf_;
  bool started_ = false, first_ = true;
  bool write_failed_ = false;
  std::map<uint64_t, Track> tracks_;  // key vm << 32 | tid
  std::set<uint32_t> vms_;
  std::map<uint32_t, std::string> vm_names_;
  std::map<uint64_t, std::string> track_names_;
  std::map<std::pair<std::string, uint64_t>, OpenIo> open_io_;  // device, io id
  const analysis::JointView* joint_ = nullptr;
  std::map<std::pair<uint32_t, uint64_t>, const analysis::JointExit*> by_handler_;
  std::set<std::pair<uint32_t, uint64_t>> matched_kernel_;
  std::vector<Kept> kept_;
  std::map<uint32_t, uint64_t> quota_;
  uint64_t drawn_ = 0;         // exit slices admitted
  bool offcpu_drawn_ = false;  // DrawOffCpuExits was called: its counts go into otherData
  std::string name_;           // scratch
};

// What `exitscope timeline` draws: a dump, a kernel trace, or both (the joint view). The
// caller opens the sources (sources/source.h) and builds the joint view; WriteTimeline replays
// the trace into the writer.
struct TimelineInputs {
  const Dump* dump = nullptr;  // read from dump_path; null: none
  std::string dump_path;
  // A kernel trace source not yet Run; null: none. Alone: opened with the caller's options
  // (device map, --tsc-mhz, ISA). With a dump: opened with analysis::JointTraceOptions.
  sources::Source* trace = nullptr;
  // A dump and a trace: their joint view (analysis::BuildJointView), required.
  const analysis::JointView* joint = nullptr;
  // `kvm stat --bpf --stacks`'s slow exits seen from the kernel, alone (no dump, no trace):
  // ts 0 is the first one's start.
  const analysis::OffCpuSlowExits* offcpu = nullptr;
};

// Replays the trace, then writes the timeline to `out_path` ("-": stdout), created only once
// the trace has been read. A dump alone: ts 0 is its first record, the VM its process. A
// trace alone: ts 0 is its first record, times on its clock. Both: the joint view, every time
// in the dump's CLOCK_MONOTONIC ns, each kernel thread on the track of the dump vCPU it runs (a
// thread that runs none on its own track, "thread <tid>"). Errors name the input or the output.
Result<TimelineStats> WriteTimeline(const TimelineInputs& in, TimelineOptions options,
                                    const std::string& out_path);

// Appends `s` as a JSON string (quoted): escapes what JSON requires and replaces invalid
// UTF-8 with U+FFFD, as the other JSON outputs do (nlohmann's error_handler_t::replace).
void AppendJsonString(std::string& out, std::string_view s);

}  // namespace exitscope::report
