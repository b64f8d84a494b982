#include "sources/dump_source.h"

namespace exitscope::sources {
namespace {

SubKeyKind SubKeyOf(ExitKind k) noexcept {
  switch (k) {
    case ExitKind::kPio:
      return SubKeyKind::kPort;
    case ExitKind::kMmio:
      return SubKeyKind::kMmio;
    case ExitKind::kMsr:
      return SubKeyKind::kMsr;
    case ExitKind::kHypercall:
      return SubKeyKind::kHypercall;
    default:
      return SubKeyKind::kNone;
  }
}

// The KVM_EXIT_* name (without the prefix) the VMM saw for an exit of kind `k`.
std::string_view UserReason(ExitKind k, AccessDir dir) noexcept {
  switch (k) {
    case ExitKind::kPio:
      return "IO";
    case ExitKind::kMsr:
      return dir == AccessDir::kWrite ? "X86_WRMSR" : "X86_RDMSR";
    default:
      return ToString(k);
  }
}

void AddSat(uint64_t& sum, uint64_t v) noexcept {
  if (__builtin_add_overflow(sum, v, &sum)) sum = UINT64_MAX;
}

}  // namespace

std::string_view DumpSource::Intern(std::string s) {
  if (s.empty()) return {};
  return *names_.insert(std::move(s)).first;
}

ExitEvent DumpSource::ToEvent(const DumpExit& d, bool in_progress) {
  ExitEvent e;
  e.start_ns = d.start_ns;
  e.duration_ns = d.duration_ns;
  e.vcpu = d.vcpu;
  e.vm = static_cast<uint32_t>(dump_.process.pid);
  e.reason = ToString(d.kind);  // static storage, "kind#99" included
  e.user_reason = UserReason(d.kind, d.dir);
  e.subkey_kind = SubKeyOf(d.kind);
  e.subkey = d.addr;
  e.size = d.size;
  e.dir = d.dir;
  e.userspace = true;
  e.side = Side::kVmm;
  if (d.kind == ExitKind::kMmio || d.kind == ExitKind::kPio) {
    e.device = Intern(dump_.DeviceName(d.device));
    e.reg = Intern(dump_.RegisterName(d));
    if (d.device != kUnassigned) {
      const IoSpace space = SpaceOf(d.kind);
      for (const DumpRange& r : dump_.ranges) {
        if (r.space == space && d.addr >= r.base && d.addr - r.base < r.size) {
          e.device_offset = d.addr - r.base;
          break;
        }
      }
    }
  }
  if ((d.flags & kExitFlagValue) != 0) e.value = d.value;
  e.end = in_progress ? ExitEnd::kOpenAtEnd : ExitEnd::kSeen;
  e.kind = d.kind;
  e.flags = d.flags;
  return e;
}

DeviceEvent DumpSource::ToEvent(const DumpDeviceEvent& ev) {
  DeviceEvent d;
  d.time_ns = ev.time_ns;
  d.type = ev.type;
  d.device = Intern(dump_.DeviceName(ev.device));
  d.io_id = ev.io_id;
  d.status = ev.status;
  d.note = ev.note;
  return d;
}

Finding DumpSource::ToEvent(const FindingRecord& f) {
  Finding x;
  x.time_ns = f.time_ns;
  x.type = f.type;
  x.vcpu = f.vcpu;
  x.duration_ns = f.duration_ns;
  x.device = Intern(dump_.DeviceName(f.device));
  if (f.kind == ExitKind::kMmio || f.kind == ExitKind::kPio) {
    x.reg = Intern(dump_.RegisterName(f.device, f.addr, SpaceOf(f.kind), f.reg, f.reg_element,
                                      f.reg_delta, f.size));
  }
  x.io_id = f.io_id;
  x.text = f.text;
  // A capture, or only a note saying why there is none (the dump stores both).
  if (!f.stack.empty() || !f.stack.note.empty()) x.stack = &f.stack;
  return x;
}

void DumpSource::Emit(EventSink* sink) {
  for (const DumpVcpu& v : dump_.vcpus) {
    for (const DumpExit& e : v.exits) sink->OnExit(ToEvent(e, false));
    if (v.in_progress) sink->OnExit(ToEvent(*v.in_progress, true));
  }
  for (const DumpDeviceEvent& ev : dump_.device_events) sink->OnDeviceEvent(ToEvent(ev));
  for (const FindingRecord& f : dump_.findings) sink->OnFinding(ToEvent(f));
}

Capture DumpSource::capture() const {
  Capture c;
  c.clock = "CLOCK_MONOTONIC";
  for (const DumpVcpu& v : dump_.vcpus) {
    AddSat(c.lost_events, v.counters.overwritten);
    AddSat(c.lost_events, v.counters.skipped);
  }
  const DeviceEventCounters& dc = dump_.device_event_counters;
  AddSat(c.lost_events, dc.overwritten);
  AddSat(c.lost_events, dc.dropped);
  AddSat(c.lost_events, dc.skipped);
  AddSat(c.lost_events, dump_.counters.findings_dropped);
  return c;
}

}  // namespace exitscope::sources
