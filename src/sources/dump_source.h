// sources/dump_source.h: a recorder Dump (a file or a live Snapshot) as a source of the one
// event model (event.h), like a .dat or a text trace.
//
//   Result<Dump> d = ReadDump("vm.esdump");
//   sources::DumpSource src(*d);
//   src.Emit(&sink);  // sink.OnExit / OnDeviceEvent / OnFinding, one call per record
//
// Per vCPU, in the dump's order (oldest first), one ExitEvent per exit:
//   reason       ToString(kind): "MMIO", "PIO", "HLT", ... ("kind#99" for an unknown kind);
//                user_reason the KVM_EXIT_* name ("IO" for PIO, "X86_WRMSR" / "X86_RDMSR")
//   subkey       the port (kPort), guest-physical address (kMmio), MSR (kMsr) or hypercall
//                number (kHypercall); kNone for the other kinds (subkey is then the
//                recorder's addr as it is, e.g. kOther's raw exit reason; mostly 0)
//   device, reg  Dump::DeviceName / Dump::RegisterName(const DumpExit&) (the map generation
//                the exit used); empty when unassigned / no register there
//   device_offset  the access's offset inside the range that holds it (kNoOffset: none)
//   value        only when the dump carries guest data for it (flags & kExitFlagValue)
//   vm           the VMM's pid; userspace true; kind and flags as recorded (slow, stalled)
// then the exit the vCPU was inside at snapshot time, if any, as ExitEnd::kOpenAtEnd with
// duration_ns = the time spent so far. Then every device event and every finding, in the
// dump's order (oldest first).
//
// Strings: device and register names are interned in the source; notes and finding texts are
// views into the Dump. Both stay valid while the source and the Dump live: the Dump must
// outlive the source.
#pragma once

#include <string>
#include <string_view>
#include <unordered_set>

#include "exitscope/dump.h"
#include "sources/event.h"

namespace exitscope::sources {

class DumpSource {
 public:
  explicit DumpSource(const Dump& dump) : dump_(dump) {}
  DumpSource(const DumpSource&) = delete;
  DumpSource& operator=(const DumpSource&) = delete;

  // Emits every exit, then every device event, then every finding (see the file comment).
  void Emit(EventSink* sink);

  // The event of one exit (`in_progress`: the exit the vCPU was inside at snapshot time).
  ExitEvent ToEvent(const DumpExit& e, bool in_progress);
  DeviceEvent ToEvent(const DumpDeviceEvent& ev);
  Finding ToEvent(const FindingRecord& f);

  // Clock "CLOCK_MONOTONIC" (a dump's times are CLOCK_MONOTONIC ns of the recording host,
  // whatever the recorder's tick source); lost_events counts every record the recorder says
  // it lost (exits overwritten or torn, device events overwritten, dropped or torn, findings
  // dropped), saturating at 2^64-1.
  Capture capture() const;

  const Dump& dump() const noexcept { return dump_; }

 private:
  std::string_view Intern(std::string s);

  const Dump& dump_;
  std::unordered_set<std::string> names_;  // node-based: views into it stay valid
};

}  // namespace exitscope::sources
