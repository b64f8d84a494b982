// analysis/diagnosis.h: the answer a report opens with (docs/diagnosis.md): what took each
// vCPU's time, grouped by cause, ranked by the time lost, each cause with its evidence.
//
// A DiagnosisBuilder is one more EventSink on the stream a report is made of (a recorder dump,
// a kernel trace, a live tracefs stream, the eBPF maps' aggregates), so the diagnosis counts
// exactly the exits the report's tables count. The joint view (joint_view.h) has its own
// entry point, DiagnoseJoint, since its evidence is the split of each exit.
//
//   analysis::DiagnosisBuilder diag({.slow = kDumpSlowRule});
//   analysis::Summarize(dump, filter, &diag);            // the tables and the diagnosis, one pass
//   const analysis::Diagnosis d = diag.Finish();
//   for (const auto& g : d.groups) ...                   // ranked, largest loss first
//
// What is lost: the time a vCPU spent inside exits, HLT excepted (the guest asked to wait:
// counted as idle, never as lost). A group is the exits of one cause: their report row key
// ("nvme0.SQ1TDBL write", "0x3f8:POUT", "HLT") and whether they were slow (the report's
// SlowRule), handled in the kernel, or still open at the end. A stall that repeats is one
// group with its count, first and last time and distribution.
//
// Evidence, per group, each with how many of the group's exits show it:
//   io-in-flight  a backend I/O of the exit's device was in flight through the exit (from the
//                 device events: submitted before the exit ended, completed after it began);
//                 `ns` is the typical age of the oldest such I/O when the exit ended
//   queue-full    the device reported a full queue during the exit
//   stack         the watchdog's capture of the stuck thread: the blocking call, the deepest
//                 frame of the VMM's own code, the kernel frame it slept in
//   stuck         the watchdog saw the exit stuck
//   open          still inside when the recording ended (duration so far)
//   in-kernel     handled in the kernel (kernel sources): the VMM never saw these exits
//   in-vmm        (kernel sources) the exits reached the VMM: the time is its handler's
//   off-cpu, preempted, kernel-before, kernel-after, handler
//                 (joint view) where the exits' time went: the vCPU thread blocked off the
//                 CPU, preempted (runnable), in the host kernel before / after the VMM's
//                 handler, in the handler on the CPU; `ns` the time, summed over the group
// Only slow and open groups get evidence: the rest is ordinary traffic.
//
// Memory is bounded: at most kMaxKeptExits slow exits, kMaxIoSpans I/Os and kMaxStacks stack
// captures are kept for the evidence; beyond them exits are still counted and timed, and
// Diagnosis::evidence_dropped says how many went without evidence.
#pragma once

#include <array>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "analysis/joint_view.h"
#include "analysis/kept_event.h"
#include "base/histogram.h"
#include "sources/event.h"

namespace exitscope::analysis {

struct DiagnosisEvidence {
  std::string kind;    // "io-in-flight", "queue-full", "stack", ... (the header lists them)
  uint64_t exits = 0;  // of the group's exits, how many show it
  uint64_t ns = 0;     // io-in-flight: typical age of the I/O at the exit's end; joint kinds:
                       // the time summed over the group; else 0
  std::string device;  // io-in-flight, queue-full
  // stack: the most common capture among the group's exits (exits counts those like it)
  std::string call;    // the blocking call: the last frame below the VMM's own code ("read")
  std::string frame;   // the deepest frame of the VMM's own code, with file:line where known
  std::string kernel;  // the kernel function it slept in ("anon_pipe_read"), "" unknown
  char state = 0;      // the thread's /proc state letter at the capture
};

struct DiagnosisGroup {
  std::string cause;       // the report row key: "nvme0.SQ1TDBL write", "0x3f8:POUT", "HLT"
  bool slow = false;       // exits the report's SlowRule calls slow
  bool open = false;       // exits still inside when the recording ended
  bool in_kernel = false;  // exits handled in the kernel (kernel sources only)
  bool idle = false;       // HLT: the guest waited; not lost
  uint64_t count = 0;
  uint64_t lost_ns = 0;     // the exits' summed time (0 for an untimed group)
  uint64_t first_ns = 0;    // start of the first exit, from the run's start
  uint64_t last_ns = 0;     // start of the last exit, from the run's start
  uint64_t typical_ns = 0;  // p50
  uint64_t p90_ns = 0;
  uint64_t worst_ns = 0;
  std::vector<uint32_t> vcpus;              // ascending
  double share = 0;                         // lost_ns / (the run's span * its vCPUs), 0..1
  std::vector<DiagnosisEvidence> evidence;  // strongest first
};

struct DiagnosisVcpu {
  uint32_t vm = 0;  // the VMM's pid on kernel sources; 0 for a dump
  uint32_t vcpu = 0;
  uint64_t exits = 0;
  uint64_t in_exits_ns = 0;  // every timed exit
  uint64_t idle_ns = 0;      // of which HLT
  uint64_t lost_ns = 0;      // in_exits_ns - idle_ns
  uint64_t slow_ns = 0;      // of lost_ns, in slow or open exits
  uint64_t off_cpu_ns = 0;   // joint view with sched_switch: the thread off the CPU in the
                             // exits of lost_ns (HLT apart)
  double share = 0;          // lost_ns / the run's span, 0..1
};

struct Diagnosis {
  uint64_t span_ns = 0;              // the run: first exit start to last exit end
  uint64_t exits = 0;                // exits counted
  uint64_t slow_exits = 0;           // of which slow
  uint64_t open_exits = 0;           // still inside at the end
  bool timed = true;                 // false: aggregates without single exits (no first/last times)
  std::vector<DiagnosisVcpu> vcpus;  // by (vm, vcpu)
  std::vector<DiagnosisGroup> groups;  // every group but idle ones, largest lost_ns first
  std::vector<DiagnosisGroup> idle;    // HLT groups
  uint64_t evidence_dropped = 0;       // slow exits, I/Os or captures beyond the bounds
  // Nothing slow, nothing open: the one-line answer.
  bool all_well() const noexcept { return slow_exits == 0 && open_exits == 0; }
};

struct DiagnosisOptions {
  SlowRule slow;  // the report's rule (a dump: kDumpSlowRule; kvm: --slow / --duration)
  // The cause of an exit: the report row key it is counted under, in *key (a view that must
  // stay valid until the next call; the builder copies what it keeps); false leaves the exit
  // out (the report's filters). Null: TargetName + direction for exits with a port or address
  // ("nvme0.SQ1TDBL write"), the reason for the others ("HLT").
  std::function<bool(const ExitEvent&, std::string_view*)> key;
};

class DiagnosisBuilder final : public EventSink {
 public:
  static constexpr size_t kMaxKeptExits = 100000;
  static constexpr size_t kMaxIoSpans = 1 << 20;
  static constexpr size_t kMaxStacks = 10000;

  explicit DiagnosisBuilder(DiagnosisOptions options);
  // last_vcpu_ points into vcpus_: a copy would point into the original; a move takes the
  // map's nodes with it (std::allocator), so the pointer stays valid.
  DiagnosisBuilder(const DiagnosisBuilder&) = delete;
  DiagnosisBuilder& operator=(const DiagnosisBuilder&) = delete;
  DiagnosisBuilder(DiagnosisBuilder&&) = default;
  DiagnosisBuilder& operator=(DiagnosisBuilder&&) = default;
  void OnExit(const ExitEvent& e) override;
  void OnDeviceEvent(const DeviceEvent& e) override;
  void OnFinding(const Finding& f) override;
  void OnSamples(const ExitEvent& e, const SampleBatch& b) override;
  // The diagnosis of everything received so far (callable again after more events: a live
  // refresh). `span_ns`: the run's length where the stream has no single exits (the eBPF
  // maps' aggregates: the time they were collected over); else the exits' own span is used.
  Diagnosis Finish(uint64_t span_ns = 0);

 private:
  struct Group {
    DiagnosisGroup out;
    base::LatencyHistogram hist;
    std::map<uint32_t, bool> vcpus;
    uint32_t last_vcpu = UINT32_MAX;  // the vCPU last added to `vcpus`
    uint64_t stuck = 0;               // exits the watchdog saw stuck
    uint64_t userspace = 0;           // kernel sources: exits that reached the VMM
  };
  struct KeptSlow {
    uint64_t start_ns, end_ns;
    uint32_t vcpu;
    size_t group;
    std::string device;
  };
  struct IoSpan {
    uint64_t submit_ns, complete_ns;  // complete_ns: UINT64_MAX while open
  };
  struct StackSeen {
    uint64_t time_ns;
    uint32_t vcpu;
    DiagnosisEvidence what;  // kind "stack", exits 0
  };
  // The group of a cause text and flags: remembered for the last few (exits come in runs
  // of a few causes), else IndexGroup.
  size_t GroupOf(std::string_view cause, bool slow, bool open, bool in_kernel, bool idle);
  // The cause `e` is grouped under: options_.key's view, else DiagnosisCause kept in cause_;
  // false when the key function leaves `e` out.
  bool CauseOf(const ExitEvent& e, std::string_view* cause);
  size_t IndexGroup(std::string_view cause, bool slow, bool open, bool in_kernel, bool idle);
  struct TextMemo {
    std::string cause;
    uint8_t bits = 0;
    size_t group = SIZE_MAX;  // SIZE_MAX: unused
  };
  static constexpr size_t kCauseMemos = 4;
  std::array<TextMemo, kCauseMemos> text_memos_{};
  size_t next_text_memo_ = 0;
  DiagnosisVcpu* last_vcpu_ = nullptr;
  DiagnosisVcpu& Vcpu(uint32_t vm, uint32_t vcpu);

  DiagnosisOptions options_;
  // A deque: a Group holds a histogram of 30 KB, which a vector would move at every growth.
  std::deque<Group> groups_;
  std::map<std::string, size_t> group_index_;
  std::map<std::pair<uint32_t, uint32_t>, DiagnosisVcpu> vcpus_;
  std::vector<KeptSlow> kept_;
  std::map<std::string, std::map<uint64_t, uint64_t>, std::less<>> io_open_;  // device: id->t
  std::map<std::string, std::vector<IoSpan>, std::less<>> io_spans_;
  std::map<std::string, std::vector<uint64_t>, std::less<>> queue_full_;
  std::vector<StackSeen> stacks_;
  size_t io_kept_ = 0;
  uint64_t dropped_ = 0;
  uint64_t first_ns_ = UINT64_MAX, last_ns_ = 0;
  uint64_t exits_ = 0, slow_ = 0, open_ = 0;
  bool samples_ = false;
  std::string scratch_;
  std::string cause_;  // the cause text when there is no key function, kept to reuse its bytes
};

// The cause an exit is grouped under without a key function: TargetName + direction for an
// exit with a port or MMIO address ("nvme0.SQ1TDBL write"), else its reason ("HLT").
std::string DiagnosisCause(const ExitEvent& e);

// What a stack capture says: the blocking call, the VMM's deepest own frame, the kernel
// function (a DiagnosisEvidence of kind "stack", exits 0).
DiagnosisEvidence StackEvidence(const ThreadStack& st);

// The diagnosis of a joint view: each matched exit's kernel time is what the vCPU lost (the
// cause its VMM-side register, "nvme0.SQ1TDBL write"), its split the evidence (off-cpu,
// preempted, kernel-before, kernel-after, handler); an exit is slow when the kernel's duration
// is at least `slow_ns` (0: none is).
Diagnosis DiagnoseJoint(const JointView& view, uint64_t slow_ns);

}  // namespace exitscope::analysis
