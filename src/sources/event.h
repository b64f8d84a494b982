// sources/event.h: the one event model every source produces and every analysis consumes.
//
// A source (source.h: recorder dump, tracefs raw buffers, trace-cmd .dat, ftrace / perf-script
// text, the eBPF maps) calls one EventSink once per event. Events are passed by const reference and
// live only for the call: sinks copy what they keep. String fields are views into storage the
// source owns and keeps alive until the source is destroyed (interned names), so no event costs a
// heap allocation. Timestamps are nanoseconds on the capture's clock, named by Capture::clock.
//
// The enums that describe an access, a device event and a finding are the public ones of the
// recorder (exitscope/exit_record.h AccessDir, exitscope/device_events.h DeviceEventType,
// exitscope/watchdog.h FindingType), with their ToString spellings ("write", "io-submit",
// "stuck-exit"): one definition and one spelling for dumps, traces and every report.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <limits>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "exitscope/device_events.h"
#include "exitscope/exit_record.h"
#include "exitscope/stack.h"
#include "exitscope/watchdog.h"

namespace exitscope {

// Which decode table a kvm_exit record uses (the `isa` field of the tracepoint).
enum class Isa : uint8_t { kUnknown = 0, kVmx = 1, kSvm = 2, kPvm = 3 };

// What the sub-key of an exit is: a port, a guest-physical MMIO address, an MSR index or a
// hypercall number.
enum class SubKeyKind : uint8_t { kNone = 0, kPort, kMmio, kMsr, kHypercall };

// How much of an exit's time the source saw. Anything but kSeen means duration_ns is not the
// exit's time: analyses count such an event but keep it out of every time column. (A kernel
// trace leaves it 0; a recorder dump's exit in progress at snapshot time carries the time
// spent so far, a lower bound.)
enum class ExitEnd : uint8_t {
  kSeen = 0,   // start and end seen: duration_ns is the exit's time
  kOpenAtEnd,  // started, and the trace ended before the vCPU re-entered the guest
  kNotTraced,  // the trace carries no end record for it (kvm_exit without any kvm_entry, or
               // an access handled in the kernel whose exit no record shows)
};

// Which side saw an event: the kernel (a KVM trace, live tracefs, the eBPF maps) or the VMM
// (a recorder dump or snapshot). Device events and findings are always the VMM's.
enum class Side : uint8_t { kKernel = 0, kVmm = 1 };

// One exit, paired: from leaving the guest to re-entering it.
struct ExitEvent {
  uint64_t start_ns = 0;
  uint64_t duration_ns = 0;
  uint32_t vcpu = 0;
  uint32_t vm = 0;  // VM id: the VMM's pid for kernel traces
  Isa isa = Isa::kUnknown;
  std::string_view reason;  // "MMIO", "IO", "HLT", "HC_WRMSR", "EPT_VIOLATION", ...
  SubKeyKind subkey_kind = SubKeyKind::kNone;
  uint64_t subkey = 0;
  uint8_t size = 0;  // access size in bytes, 0 when none
  AccessDir dir = AccessDir::kNone;
  bool userspace = false;   // the exit reached the VMM
  std::string_view device;  // resolved device name, empty when unknown / unassigned
  std::string_view reg;     // resolved register ("SQ1TDBL", "CC+2"), empty when none
  // Offset of subkey inside the device's range when the source knows the range (recorder
  // dumps), so an access with no register there still has a place ("nvme0+0x2000");
  // kNoOffset elsewhere.
  static constexpr uint64_t kNoOffset = std::numeric_limits<uint64_t>::max();
  uint64_t device_offset = kNoOffset;
  // Set by kernel-side (kvm trace) sources; zero / empty elsewhere.
  uint32_t tid = 0;              // host thread that ran the vCPU
  uint64_t guest_rip = 0;        // guest RIP at the exit when known
  uint64_t value = 0;            // value written / read (port, MMIO, MSR data) when known;
                                 // from a dump only when flags has kExitFlagValue
  std::string_view user_reason;  // KVM_EXIT_* name without prefix ("IO", "MMIO", "HLT") when
                                 // the exit reached userspace
  bool failed_vmentry = false;   // VMX exit_reason bit 31 / PVM FAILED_VMENTRY
  ExitEnd end = ExitEnd::kSeen;  // kSeen: duration_ns is known (see ExitEnd)
  // An access (kvm_pio, kvm_mmio, kvm_msr, kvm_hypercall) the kernel handled without an exit
  // to userspace, on a host whose trace shows no exit record for it (no kvm_exit: kvm-pvm).
  // It is not an exit of the trace: `reason` is "PIO"/"MMIO"/"MSR"/"HYPERCALL", userspace is
  // false, end is kNotTraced. Exit tables skip it; access tables (ioport, mmio, ...) count it
  // as handled in the kernel.
  bool kernel_access = false;
  // Set by recorder dumps; kUnknown / 0 elsewhere.
  ExitKind kind = ExitKind::kUnknown;  // the recorder's kind (reason is ToString(kind))
  uint8_t flags = 0;          // the recorder's ExitFlags: kExitFlagValue (value is guest data),
                              // kExitFlagSlow (reached the slow-exit threshold), kExitFlagStalled
                              // (the watchdog saw it stuck), kExitFlagNoEnd
  Side side = Side::kKernel;  // kVmm from a recorder dump (sources::DumpSource)
  // Field by field, the strings by their text.
  bool operator==(const ExitEvent&) const = default;
};

// Many samples of one exit key, aggregated before they reached userspace (the eBPF maps of
// `kvm stat --bpf`): a histogram in the LatencyHistogram's buckets plus exact moments.
struct SampleBatch {
  std::span<const std::pair<uint32_t, uint64_t>> buckets;  // (bucket, count)
  uint64_t timed = 0;  // as the source counted them (the row counts what the buckets hold)
  uint64_t sum = 0, min = 0, max = 0;
  long double sum_squares = 0;
  uint64_t untimed = 0;
  // Which of the source's aggregates this is (an eBPF map key's bytes), empty when it has no
  // such identity. A source that reads the same aggregates again (each scrape of
  // `kvm stat --bpf --metrics`) reports running totals under the same source_key: a sink that
  // follows them over time (cli::KernelMetrics) adds only what a key gained.
  std::string_view source_key;
};

// A device-side event: an I/O submitted or completed (matched by io_id), a full queue, a
// backend error, or a free-form note.
struct DeviceEvent {
  uint64_t time_ns = 0;
  DeviceEventType type = DeviceEventType::kNote;
  std::string_view device;
  uint64_t io_id = 0;
  int64_t status = 0;  // completion status / errno for errors
  std::string_view note;
};

// A watchdog finding: a vCPU stuck in an exit (kStuckExitBegin while still inside,
// kStuckExitEnd when it ended, kStuckExitStack a later capture while still inside), an I/O in
// flight too long (kAgedIo), a slow exit (kSlowExit).
struct Finding {
  uint64_t time_ns = 0;
  FindingType type = FindingType::kStuckExitBegin;
  uint32_t vcpu = 0;  // the exit's vCPU (not kAgedIo)
  uint64_t duration_ns =
      0;  // so far (kStuckExitBegin, kAgedIo) or total (kStuckExitEnd, kSlowExit)
  std::string_view device;
  std::string_view reg;
  uint64_t io_id = 0;
  std::string_view text;  // the human line as logged
  // What the stuck vCPU thread was doing (exitscope/stack.h): its frames, state and note, as
  // the source owns them (valid for the call, like the strings); nullptr when the finding has
  // no stack (another type, no capture made, or a source without stacks).
  const ThreadStack* stack = nullptr;
};

// Receives a source's events in time order per vCPU (not necessarily globally).
class EventSink {
 public:
  virtual ~EventSink() = default;
  virtual void OnExit(const ExitEvent& e) = 0;
  virtual void OnDeviceEvent(const DeviceEvent&) {}
  virtual void OnFinding(const Finding&) {}
  // Samples of one exit key aggregated at the source (an eBPF map entry): `e` is the exit
  // they all are (duration_ns and end unused). A sink that keeps single exits ignores them.
  virtual void OnSamples(const ExitEvent&, const SampleBatch&) {}
};

// Hands every event to each of its sinks, in order (the sinks are not owned).
class TeeSink final : public EventSink {
 public:
  explicit TeeSink(std::initializer_list<EventSink*> sinks) : sinks_(sinks) {}
  void OnExit(const ExitEvent& e) override {
    for (EventSink* s : sinks_) s->OnExit(e);
  }
  void OnDeviceEvent(const DeviceEvent& e) override {
    for (EventSink* s : sinks_) s->OnDeviceEvent(e);
  }
  void OnFinding(const Finding& f) override {
    for (EventSink* s : sinks_) s->OnFinding(f);
  }
  void OnSamples(const ExitEvent& e, const SampleBatch& b) override {
    for (EventSink* s : sinks_) s->OnSamples(e, b);
  }

 private:
  std::vector<EventSink*> sinks_;
};

// What a source knows about the capture as a whole.
struct Capture {
  std::string clock;         // "x86-tsc", "CLOCK_MONOTONIC", "local", ...
  uint64_t lost_events = 0;  // records the source knows were lost (overwritten, dropped)
  uint64_t unpaired = 0;     // records that could not be paired into an exit
};

}  // namespace exitscope

namespace exitscope {
std::string_view ToString(Isa isa) noexcept;
std::string_view ToString(SubKeyKind k) noexcept;
std::string_view ToString(ExitEnd e) noexcept;
}  // namespace exitscope
