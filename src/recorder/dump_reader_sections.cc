// recorder/dump_reader_sections.cc: the readers of a dump's sections, one function each
// (dump_reader_sections.h): every field bounds-checked, what cannot be true in one record
// repaired and counted in ReadIssues, a section that cannot be read named with its offset.
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "exitscope/dump.h"
#include "recorder/dump_format.h"
#include "recorder/dump_reader_sections.h"
#include "recorder/exit_codec.h"

namespace exitscope::internal::dump_read {
namespace {

// An unknown kind is kept as its raw value (shown as "kind#N"); an unknown direction becomes
// kNone; both are counted in `issues`.
void CheckRaw(DumpExit* e, ReadIssues* issues) {
  const uint8_t kind = static_cast<uint8_t>(e->kind);
  const uint8_t dir = static_cast<uint8_t>(e->dir);
  if (kind >= kExitKindCount) issues->Kind(kind);
  if (dir > 2) {
    issues->Dir(dir);
    e->dir = AccessDir::kNone;
  }
}

// Reads one exit record (versions 1 and 2: fixed size). Only a short read fails it; an unknown kind
// is kept as its raw value (shown as "kind#N") and an unknown direction becomes kNone, both counted
// in `issues`.
bool ReadExit(Reader& r, uint32_t version, DumpExit* e, ReadIssues* issues) {
  e->start_ns = r.U64();
  e->duration_ns = r.U64();
  e->addr = r.U64();
  e->value = r.U64();
  e->vcpu = r.U32();
  e->device = r.U32();
  e->reg = r.U32();
  e->reg_element = r.U32();
  e->reg_delta = r.U32();
  const uint8_t kind = r.U8();
  e->size = r.U8();
  const uint8_t dir = r.U8();
  e->flags = r.U8();
  e->map = version >= 2 ? r.U32() : kNoRegister;  // version 1: named from the ranges
  if (!r.ok()) return false;
  e->kind = static_cast<ExitKind>(kind);
  e->dir = static_cast<AccessDir>(dir);
  CheckRaw(e, issues);
  return true;
}

// Per-record checks of an exit stored under `vcpu`: what is wrong in one record is repaired in
// that record and counted.
void CheckExit(const Dump& d, uint32_t vcpu, DumpExit* e, ReadIssues* issues) {
  if (e->device != kUnassigned && e->device >= d.devices.size()) {
    ++issues->bad_device;
    e->device = kUnassigned;
    e->reg = kNoRegister;
    e->map = kNoRegister;
  }
  if (e->map != kNoRegister && e->map >= d.maps.size()) {
    ++issues->bad_map;
    e->map = kNoRegister;
    e->reg = kNoRegister;
  }
  if (!d.includes_guest_data && (e->value != 0 || (e->flags & kExitFlagValue) != 0)) {
    ++issues->stray_guest_data;
    e->value = 0;
    e->flags &= static_cast<uint8_t>(~kExitFlagValue);
  }
  if (e->vcpu != vcpu) {
    ++issues->vcpu_mismatch;
    e->vcpu = vcpu;
  }
}

}  // namespace

Status ReadMeta(const DumpView& sections, Dump* d, ReadIssues* /*issues*/) {
  const std::string_view strs = sections.strings();
  Reader r = sections.Open(kMeta);
  d->monotonic_ns = r.U64();
  d->realtime_ns = r.U64();
  const uint8_t src = r.U8();
  d->clock.tsc_invariant = r.U8() != 0;
  d->clock.tsc_known_freq = r.U8() != 0;
  r.U8();
  d->clock.ns_per_tick = r.F64();
  d->clock.tsc_hz = r.U64();
  d->clock.base_ticks = r.U64();
  d->clock.base_ns = r.U64();
  if (r.ok() && src > 1) r.Bad("clock source " + std::to_string(src) + " is unknown");
  d->clock.source = static_cast<ClockSource>(src & 1);
  d->slow_exit_threshold_ns = r.U64();
  d->watchdog.stuck_exit_ns = r.U64();
  d->watchdog.io_age_ns = r.U64();
  d->watchdog.poll_ns = r.U64();
  d->watchdog_running = r.U8() != 0;
  d->process.pid = r.I64();
  d->process.comm = r.Str(strs);
  const uint32_t argc = r.U32();
  if (r.Count(argc, 8, "argv")) {
    for (uint32_t i = 0; i < argc && r.ok(); ++i) d->process.argv.push_back(r.Str(strs));
  }
  d->process.start_realtime_ns = r.U64();
  for (std::string* s : {&d->host.sysname, &d->host.nodename, &d->host.release, &d->host.version,
                         &d->host.machine, &d->host.cpu_model}) {
    *s = r.Str(strs);
  }
  d->host.cpus = r.U32();
  RecorderCounters& c = d->counters;
  for (uint64_t* v :
       {&c.bad_vcpu, &c.end_without_begin, &c.begin_without_end, &c.slow_exits, &c.findings_dropped,
        &c.io_inflight_overflow, &c.io_untracked_completions, &c.io_in_flight}) {
    *v = r.U64();
  }
  DeviceEventCounters& e = d->device_event_counters;
  for (uint64_t* v : {&e.capacity, &e.written, &e.overwritten, &e.dropped, &e.skipped})
    *v = r.U64();
  const uint32_t nattr = r.U32();
  if (r.Count(nattr, 16, "attribute")) {
    for (uint32_t i = 0; i < nattr && r.ok(); ++i) {
      std::string k = r.Str(strs);
      std::string v = r.Str(strs);
      d->attributes.emplace_back(std::move(k), std::move(v));
    }
  }
  if (!r.ok()) return r.Fail();
  return {};
}

Status ReadDevices(const DumpView& sections, Dump* d, ReadIssues* /*issues*/) {
  const std::string_view strs = sections.strings();
  Reader r = sections.Open(kDevices);
  const uint32_t n = r.U32();
  if (r.Count(n, 28, "device")) {
    for (uint32_t i = 0; i < n && r.ok(); ++i) {
      DeviceInfo dev;
      dev.index = r.U32();
      dev.id = r.U64();
      dev.name = r.Str(strs);
      dev.kind = r.Str(strs);
      if (r.ok() && dev.index != i)
        r.Bad("device " + std::to_string(i) + " has index " + std::to_string(dev.index));
      d->devices.push_back(std::move(dev));
    }
  }
  if (!r.ok()) return r.Fail();
  return {};
}

Status ReadMaps(const DumpView& sections, Dump* d, ReadIssues* /*issues*/) {
  const std::string_view strs = sections.strings();
  Reader r = sections.Open(kMaps);
  const uint32_t n = r.U32();
  if (r.Count(n, 12, "register map")) {
    for (uint32_t i = 0; i < n && r.ok(); ++i) {
      std::string name = r.Str(strs);
      const uint32_t nregs = r.U32();
      std::vector<RegisterDef> defs;
      if (!r.Count(nregs, 44, "register")) break;
      for (uint32_t k = 0; k < nregs && r.ok(); ++k) {
        RegisterDef def;
        def.name = r.Str(strs);
        def.offset = r.U64();
        def.width = r.U32();
        const uint8_t acc = r.U8();
        def.alias = r.U8() != 0;
        r.U16();
        def.count = r.U32();
        def.stride = r.U64();
        def.description = r.Str(strs);
        if (r.ok() && (acc < 1 || acc > 3))
          r.Bad("register access " + std::to_string(acc) + " is unknown");
        def.access = static_cast<RegAccess>(acc);
        defs.push_back(std::move(def));
      }
      if (!r.ok()) break;
      auto m = RegisterMap::Create(name, std::move(defs));
      if (!m) {
        r.Bad("register map " + std::to_string(i) + ": " + m.error().message);
        break;
      }
      d->maps.push_back(std::move(*m));
    }
  }
  if (!r.ok()) return r.Fail();
  return {};
}

Status ReadRanges(const DumpView& sections, Dump* d, ReadIssues* /*issues*/) {
  Reader r = sections.Open(kRanges);
  const uint32_t n = r.U32();
  if (r.Count(n, 28, "range")) {
    for (uint32_t i = 0; i < n && r.ok(); ++i) {
      DumpRange rg;
      const uint8_t space = r.U8();
      r.U8();
      r.U16();
      rg.device = r.U32();
      rg.base = r.U64();
      rg.size = r.U64();
      rg.map = r.U32();
      if (!r.ok()) break;
      if (space > 1) r.Bad("range space " + std::to_string(space) + " is unknown");
      if (rg.device >= d->devices.size())
        r.Bad("range " + std::to_string(i) + " names device " + std::to_string(rg.device) + " of " +
              std::to_string(d->devices.size()));
      if (rg.map != kNoRegister && rg.map >= d->maps.size())
        r.Bad("range " + std::to_string(i) + " names register map " + std::to_string(rg.map));
      rg.space = static_cast<IoSpace>(space & 1);
      d->ranges.push_back(rg);
    }
  }
  if (!r.ok()) return r.Fail();
  return {};
}

Status ReadVcpusAndExits(const DumpView& sections, Dump* d, ReadIssues* issues) {
  const std::string_view strs = sections.strings();
  Reader v = sections.Open(kVcpus);
  Reader x = sections.Open(kExits);
  const uint64_t total = x.U64();
  const uint64_t min_record = sections.version >= 3   ? kMinCodedExit
                              : sections.version == 2 ? kExitRecordSize
                                                      : kExitRecordSizeV1;
  if (!x.Count(total, min_record, "exit")) return x.Fail();
  // Version 3: coded records (exit_codec.h), read straight from the section's bytes.
  const std::string_view xs = sections.data[kExits];
  const char* xp = xs.data() + 8;
  const char* const xend = xs.data() + xs.size();
  ExitDecoder dec;
  bool coded_ok = true;
  uint64_t decoded = 0;  // records decoded before a bad one
  const uint32_t n = v.U32();
  uint64_t consumed = 0;
  if (v.Count(n, 45, "vcpu")) {
    for (uint32_t i = 0; i < n && v.ok() && x.ok(); ++i) {
      DumpVcpu c;
      c.vcpu = v.U32();
      c.counters.capacity = v.U64();
      c.counters.written = v.U64();
      c.counters.overwritten = v.U64();
      c.counters.skipped = v.U64();
      const uint64_t count = v.U64();
      const uint8_t has = v.U8();
      if (!v.ok()) break;
      if (has > 1) {
        v.Bad("in-progress flag " + std::to_string(has) + " is not 0 or 1");
        break;
      }
      if (c.vcpu != i) {
        v.Bad("vCPU entry " + std::to_string(i) + " has index " + std::to_string(c.vcpu) +
              " (the writer numbers them 0, 1, 2, ...)");
        break;
      }
      if (c.counters.overwritten > c.counters.written || c.counters.skipped > c.counters.written ||
          count > c.counters.written) {
        issues->lines.push_back("vCPU " + std::to_string(i) + " ring counters cannot be true (" +
                                std::to_string(c.counters.written) + " written, " +
                                std::to_string(c.counters.overwritten) + " overwritten, " +
                                std::to_string(c.counters.skipped) + " skipped, " +
                                std::to_string(count) + " held)");
      }
      if (has == 1) {
        DumpExit e;
        if (!ReadExit(v, sections.version, &e, issues)) break;
        CheckExit(*d, c.vcpu, &e, issues);
        c.in_progress = e;
      }
      const uint32_t nc = v.U32();
      if (!v.Count(nc, 16, "counter")) break;
      for (uint32_t k = 0; k < nc && v.ok(); ++k) {
        std::string name = v.Str(strs);
        const uint64_t val = v.U64();
        c.named_counters[std::move(name)] = val;
      }
      if (count > total - consumed) {
        v.Bad("vCPU " + std::to_string(c.vcpu) + " claims " + std::to_string(count) +
              " exits; the exits section has " + std::to_string(total - consumed) + " left");
        break;
      }
      consumed += count;
      c.exits.reserve(count);
      if (sections.version >= 3) {
        dec.NextVcpu();
        for (uint64_t k = 0; k < count; ++k) {
          DumpExit& e = c.exits.emplace_back();
          if (!dec.Get(&xp, xend, c.vcpu, &e)) {
            coded_ok = false;
            break;
          }
          ++decoded;
          CheckRaw(&e, issues);
          CheckExit(*d, c.vcpu, &e, issues);
        }
        if (!coded_ok) break;
      } else {
        for (uint64_t k = 0; k < count && x.ok(); ++k) {
          DumpExit e;
          if (!ReadExit(x, sections.version, &e, issues)) break;
          CheckExit(*d, c.vcpu, &e, issues);
          c.exits.push_back(e);
        }
      }
      d->vcpus.push_back(std::move(c));
    }
  }
  if (!v.ok()) return v.Fail();
  if (!x.ok()) return x.Fail();
  if (!coded_ok) {
    return sections.Corrupt(
        "section 'exits' is corrupt at offset " +
        std::to_string(sections.offset[kExits] + static_cast<uint64_t>(xp - xs.data())) +
        ": exit record " + std::to_string(decoded) + ": " + dec.why());
  }
  if (sections.version >= 3 && xp != xend) {
    return sections.Corrupt(
        "section 'exits' has " + std::to_string(xend - xp) +
        " bytes after its last exit record (offset " +
        std::to_string(sections.offset[kExits] + static_cast<uint64_t>(xp - xs.data())) + ")");
  }
  if (consumed != total) {
    return sections.Corrupt("section 'exits' holds " + std::to_string(total) +
                            " exits but the vCPUs account for " + std::to_string(consumed));
  }
  return {};
}

Status ReadDeviceEvents(const DumpView& sections, Dump* d, ReadIssues* issues) {
  const std::string_view strs = sections.strings();
  Reader r = sections.Open(kDeviceEvents);
  const uint32_t n = r.U32();
  if (r.Count(n, 40, "device event")) {
    for (uint32_t i = 0; i < n && r.ok(); ++i) {
      DumpDeviceEvent e;
      e.time_ns = r.U64();
      const uint8_t type = r.U8();
      e.note_truncated = r.U8() != 0;
      r.U16();
      e.device = r.U32();
      e.io_id = r.U64();
      e.status = r.I64();
      e.note = r.Str(strs);
      if (!r.ok()) break;
      if (type > static_cast<uint8_t>(DeviceEventType::kNote)) {
        issues->lines.push_back("device event " + std::to_string(i) + " has unknown type " +
                                std::to_string(type) + "; skipped");
        continue;
      }
      e.type = static_cast<DeviceEventType>(type);
      d->device_events.push_back(std::move(e));
    }
  }
  if (!r.ok()) return r.Fail();
  return {};
}

Status ReadFindings(const DumpView& sections, Dump* d, ReadIssues* issues) {
  const std::string_view strs = sections.strings();
  Reader r = sections.Open(kFindings);
  const uint32_t n = r.U32();
  if (r.Count(n, 64, "finding")) {
    issues->finding_at.assign(n, ReadIssues::kSkippedFinding);
    for (uint32_t i = 0; i < n && r.ok(); ++i) {
      FindingRecord f;
      f.time_ns = r.U64();
      const uint8_t type = r.U8();
      const uint8_t kind = r.U8();
      const uint8_t dir = r.U8();
      f.size = r.U8();
      f.vcpu = r.U32();
      f.duration_ns = r.U64();
      f.addr = r.U64();
      f.device = r.U32();
      f.reg = r.U32();
      f.reg_element = r.U32();
      f.reg_delta = r.U32();
      f.io_id = r.U64();
      f.text = r.Str(strs);
      if (!r.ok()) break;
      if (type > static_cast<uint8_t>(FindingType::kStuckExitStack)) {
        ++issues->unknown_finding;
        continue;  // a finding of a type this reader cannot name: counted, not shown
      }
      if (kind >= kExitKindCount) issues->Kind(kind);
      if (dir > 2) issues->Dir(dir);
      f.type = static_cast<FindingType>(type);
      f.kind = static_cast<ExitKind>(kind);
      f.dir = dir > 2 ? AccessDir::kNone : static_cast<AccessDir>(dir);
      if (f.device != kUnassigned && f.device >= d->devices.size()) {
        ++issues->bad_device;
        f.device = kUnassigned;
        f.reg = kNoRegister;
      }
      issues->finding_at[i] = static_cast<uint32_t>(d->findings.size());
      d->findings.push_back(std::move(f));
    }
  }
  if (!r.ok()) return r.Fail();
  return {};
}

Status ReadStacks(const DumpView& sections, Dump* d, ReadIssues* issues) {
  if (!sections.present[kStacks]) return {};  // a file older than version 4
  const std::string_view strs = sections.strings();
  Reader r = sections.Open(kStacks);
  const uint32_t nvcpus = r.U32();
  if (r.ok() && nvcpus != d->vcpus.size()) {
    r.Bad("it holds " + std::to_string(nvcpus) + " thread ids for " +
          std::to_string(d->vcpus.size()) + " vCPUs");
  }
  if (r.Count(nvcpus, 4, "thread id")) {
    for (DumpVcpu& c : d->vcpus) c.tid = static_cast<int32_t>(r.U32());
  }
  StackCounters& sc = d->stack_counters;
  for (uint64_t* v : {&sc.captures, &sc.signal_timeouts, &sc.exit_changed, &sc.frames_dropped,
                      &sc.captures_skipped}) {
    *v = r.U64();
  }
  const uint32_t n = r.U32();
  constexpr uint64_t kMinStack = 36;  // an entry without frames
  constexpr uint64_t kFrameSize = 44;
  const uint64_t file_findings = issues->finding_at.size();
  uint64_t next = 0;  // the lowest finding index the next entry may name
  if (r.Count(n, kMinStack, "stack")) {
    for (uint32_t i = 0; i < n && r.ok(); ++i) {
      const uint32_t index = r.U32();
      ThreadStack st;
      st.tid = static_cast<int32_t>(r.U32());
      st.state = static_cast<char>(r.U8());
      r.U8();
      r.U16();
      st.capture = r.U32();
      st.user_dropped = r.U32();
      st.note = r.Str(strs);
      const uint32_t nuser = r.U32();
      const uint32_t nkernel = r.U32();
      if (!r.ok()) break;
      if (index >= file_findings) {
        r.Bad("stack " + std::to_string(i) + " names finding " + std::to_string(index) + " of " +
              std::to_string(file_findings));
        break;
      }
      if (index < next) {
        r.Bad("stack " + std::to_string(i) + " names finding " + std::to_string(index) +
              " out of order (the findings' stacks are stored in finding order, once each)");
        break;
      }
      next = uint64_t{index} + 1;
      if (!r.Count(uint64_t{nuser} + nkernel, kFrameSize, "frame")) break;
      for (std::vector<StackFrame>* frames : {&st.user, &st.kernel}) {
        const uint32_t count = frames == &st.user ? nuser : nkernel;
        frames->reserve(count);
        for (uint32_t k = 0; k < count && r.ok(); ++k) {
          StackFrame& fr = frames->emplace_back();
          fr.ip = r.U64();
          fr.offset = r.U64();
          fr.function = r.Str(strs);
          fr.module = r.Str(strs);
          fr.file = r.Str(strs);
          fr.line = r.U32();
        }
      }
      if (!r.ok()) break;
      const uint32_t at = issues->finding_at[index];
      if (at != ReadIssues::kSkippedFinding) d->findings[at].stack = std::move(st);
    }
  }
  if (!r.ok()) return r.Fail();
  return {};
}

}  // namespace exitscope::internal::dump_read
