// sources/source.h: the one way into the event model (event.h). Open a file or a live capture,
// its format found once, and feed every event to one EventSink.
//
//   auto src = sources::OpenSource(path, {});   // Result<std::unique_ptr<Source>>
//   if (!src) return Propagate(src);
//   Status s = (*src)->Run(&sink);              // every event, once
//   const SourceInfo& i = (*src)->info();       // format, clock, side, losses
//
// Files, sniffed by content (input_format.h), never by name:
//   recorder dump (.esdump)      the VMM's side: sources::DumpSource over the file's Dump
//   trace-cmd .dat, `trace-cmd report` / ftrace `trace` / `perf script` text
//                                the kernel's side: KvmInput records paired by KvmPairer
// Live (their own constructors, the same Run): the tracefs stream (tracefs_live.h) and the
// eBPF maps, whose per-key aggregates arrive as EventSink::OnSamples (analysis/bpf_kvm_rows.h).
//
// A source adds nothing to the events: analyses (analysis/) decide what is slow, open or
// grouped together, renderers (report/renderer.h) how it reads.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "exitscope/dump.h"
#include "exitscope/status.h"
#include "sources/event.h"
#include "sources/kvm_input.h"
#include "sources/kvm_pairing.h"

namespace exitscope::sources {

// What a source knows about its capture. Format, clock and side are known once it is open;
// losses and the pairing counters once Run returned.
struct SourceInfo {
  std::string name;    // the file as given, or "live"
  std::string format;  // "recorder dump", "trace-cmd .dat", "trace-cmd report", "ftrace",
                       // "perf script", "tracefs", "eBPF in-kernel aggregation"
  Side side = Side::kKernel;
  std::string clock;     // the capture's clock ("x86-tsc", "mono", "CLOCK_MONOTONIC", ...)
  uint64_t tsc_khz = 0;  // used to convert a cycle clock to ns (0: the clock is in ns)
  bool tsc_khz_from_host = false;
  ClockScale scale{};           // the clock's units to ns
  uint64_t lost_at_record = 0;  // overruns the capture recorded (trace-cmd CPUSTAT)
};

class Source {
 public:
  virtual ~Source() = default;
  // Feeds every event to `sink`; call once.
  virtual Status Run(EventSink* sink) = 0;
  virtual const SourceInfo& info() const noexcept = 0;
  // The kernel sources' pairing counters (what was paired, open, lost); null for a dump.
  virtual const KvmPairingStats* pairing() const noexcept { return nullptr; }
  // A dump source's Dump (its counters and maps are no events); null for the others.
  virtual const Dump* dump() const noexcept { return nullptr; }
  // A kernel trace: also hands every record to `fn` before pairing it, during Run (call before
  // Run; KvmPairer::SetRecordObserver): the joint view's sched_switch records, the timeline's
  // first record time. A dump has no records: ignored.
  virtual void ObserveRecords(void (*fn)(const KvmRecord&, void*), void* ctx) {
    (void)fn;
    (void)ctx;
  }
};

struct SourceOptions {
  KvmInputOptions input{};  // a kernel trace: text ISA, TSC frequency
  // A kernel trace: PVM numbering and the device map (`clock` is set from the trace).
  KvmPairerOptions pairer{};
  // A kernel trace: keep times in the capture's raw units (ticks of a cycle clock), as the
  // joint view needs them to convert with the dump's calibration; else ns.
  bool raw_clock = false;
};

// Opens `path` (see the file comment). Errors name the path: kNotFound, kInvalidArgument (a
// directory, FIFO, device, "-"), kCorrupt / kUnsupported (the reader's own), kIo.
Result<std::unique_ptr<Source>> OpenSource(const std::string& path, const SourceOptions& options);

// A kernel trace only (a dump is refused with one line saying `exitscope inspect` reads it).
Result<std::unique_ptr<Source>> OpenKernelTrace(const std::string& path,
                                                const SourceOptions& options);

// A recorder Dump already in memory (a live Snapshot, or a dump read by the caller) as a
// source; `dump` must outlive it.
std::unique_ptr<Source> DumpAsSource(const Dump& dump, std::string name);

}  // namespace exitscope::sources
