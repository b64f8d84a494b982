// Dump reader: ParseDump (bounds-checked, every section's CRC32 verified, corrupt input named
// by section and offset) and ReadDump (regular files only, size-bounded before any read).
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <string>
#include <tuple>
#include <vector>

#include "base/file_read.h"
#include "base/text.h"
#include "exitscope/dump.h"
#include "recorder/dump_format.h"
#include "recorder/exit_codec.h"

namespace exitscope {

using namespace internal;  // dump_format.h, text.h

namespace {

class Reader {
 public:
  Reader(std::string_view data, const char* section, uint64_t base, std::string_view origin)
      : data_(data), section_(section), base_(base), origin_(origin) {}

  bool ok() const { return error_.empty(); }
  size_t remaining() const { return data_.size() - pos_; }
  uint8_t U8() { return static_cast<uint8_t>(Le(1)); }
  uint16_t U16() { return static_cast<uint16_t>(Le(2)); }
  uint32_t U32() { return static_cast<uint32_t>(Le(4)); }
  uint64_t U64() { return Le(8); }
  int64_t I64() { return static_cast<int64_t>(Le(8)); }
  double F64() {
    const uint64_t u = Le(8);
    double d;
    std::memcpy(&d, &u, 8);
    return d;
  }
  std::string Str(std::string_view strings) {
    const uint32_t off = U32();
    const uint32_t len = U32();
    if (!ok()) return {};
    if (off > strings.size() || len > strings.size() - off) {
      Bad("string reference [" + std::to_string(off) + ", +" + std::to_string(len) +
          "] is outside the strings section (" + std::to_string(strings.size()) + " bytes)");
      return {};
    }
    return std::string(strings.substr(off, len));
  }
  // A count of records of at least `min_size` bytes each must fit in what is left.
  bool Count(uint64_t n, uint64_t min_size, const char* what) {
    if (!ok()) return false;
    if (min_size != 0 && n > remaining() / min_size) {
      Bad(std::string(what) + " count " + std::to_string(n) + " needs at least " +
          std::to_string(n * min_size) + " bytes, " + std::to_string(remaining()) + " left");
      return false;
    }
    return true;
  }
  void Bad(const std::string& why) {
    if (error_.empty()) {
      error_ = std::string(origin_) + ": section '" + section_ + "' is corrupt at offset " +
               std::to_string(base_ + pos_) + ": " + why;
    }
  }
  Unexpected Fail() const { return exitscope::Fail(ErrorCode::kCorrupt, error_); }

 private:
  uint64_t Le(int n) {
    if (!ok()) return 0;
    if (remaining() < static_cast<size_t>(n)) {
      error_ = std::string(origin_) + ": truncated at offset " +
               std::to_string(base_ + data_.size()) + ": section '" + section_ + "' needs " +
               std::to_string(n) + " more bytes at offset " + std::to_string(base_ + pos_);
      return 0;
    }
    uint64_t v = 0;
    for (int i = 0; i < n; ++i)
      v |= static_cast<uint64_t>(static_cast<unsigned char>(data_[pos_ + i])) << (8 * i);
    pos_ += n;
    return v;
  }
  std::string_view data_;
  size_t pos_ = 0;
  const char* section_;
  uint64_t base_;
  std::string_view origin_;
  std::string error_;
};

// What the reader found wrong inside records but read past (Dump::warnings).
struct ReadIssues {
  uint64_t unknown_kind = 0;
  unsigned first_kind = 0;
  uint64_t unknown_dir = 0;
  unsigned first_dir = 0;
  uint64_t bad_device = 0;
  uint64_t bad_map = 0;
  uint64_t stray_guest_data = 0;
  uint64_t vcpu_mismatch = 0;
  uint64_t unknown_finding = 0;
  uint64_t bad_utf8 = 0;
  std::vector<std::string> lines;  // other findings, one line each

  void Kind(uint8_t k) {
    if (unknown_kind++ == 0) first_kind = k;
  }
  void Dir(uint8_t d) {
    if (unknown_dir++ == 0) first_dir = d;
  }
};

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

}  // namespace

Result<Dump> ParseDump(std::string_view bytes, std::string_view origin) {
  const std::string o(origin);
  auto corrupt = [&](const std::string& why) { return Fail(ErrorCode::kCorrupt, o + ": " + why); };
  if (bytes.size() < 8) {
    return corrupt("truncated at offset " + std::to_string(bytes.size()) +
                   ": the header needs 8 bytes of magic (not an exitscope dump?)");
  }
  if (std::memcmp(bytes.data(), kDumpMagic, 8) != 0) {
    return corrupt("not an exitscope dump (bad magic)");
  }
  if (bytes.size() < kHeaderSize) {
    return corrupt("truncated at offset " + std::to_string(bytes.size()) + ": the header needs " +
                   std::to_string(kHeaderSize) + " bytes");
  }
  Reader h(bytes.substr(0, kHeaderSize), "header", 0, origin);
  for (int i = 0; i < 8; ++i) h.U8();
  const uint32_t version = h.U32();
  const uint32_t header_size = h.U32();
  const uint32_t flags = h.U32();
  const uint32_t nsec = h.U32();
  const uint64_t file_size = h.U64();
  const uint32_t table_crc = h.U32();
  const uint32_t header_crc = h.U32();
  if (version == 0) return corrupt("dump version 0 is invalid");
  if (version > kDumpVersion) {
    return Fail(ErrorCode::kUnsupported, o + ": dump version " + std::to_string(version) +
                                             " is newer than this exitscope (max " +
                                             std::to_string(kDumpVersion) + ")");
  }
  {
    std::string hdr(bytes.substr(0, kHeaderSize));
    std::memset(hdr.data() + 36, 0, 4);
    const uint32_t c = Crc32(hdr);
    if (c != header_crc) {
      return corrupt("header checksum mismatch (stored " + base::Hex(header_crc) + ", computed " +
                     base::Hex(c) + ")");
    }
  }
  if (header_size != kHeaderSize)
    return corrupt("header size " + std::to_string(header_size) + " is not 64");
  if ((flags & ~kFlagGuestData) != 0) return corrupt("unknown header flags " + base::Hex(flags));
  if (nsec > 1024) return corrupt("section count " + std::to_string(nsec) + " is implausible");
  const uint64_t table_end = kHeaderSize + static_cast<uint64_t>(nsec) * kSectionEntrySize;
  if (bytes.size() < table_end) {
    return corrupt("truncated at offset " + std::to_string(bytes.size()) +
                   ": the section table needs " + std::to_string(table_end) + " bytes");
  }
  const std::string_view table = bytes.substr(kHeaderSize, table_end - kHeaderSize);
  if (Crc32(table) != table_crc) return corrupt("section table checksum mismatch");
  std::string_view sections[kSectionCount + 1];
  uint64_t section_base[kSectionCount + 1] = {};
  bool seen[kSectionCount + 1] = {};
  Reader t(table, "section table", kHeaderSize, origin);
  std::vector<std::tuple<uint64_t, uint64_t, const char*>> extents;  // offset, length, name
  for (uint32_t i = 0; i < nsec; ++i) {
    const uint32_t id = t.U32();
    t.U32();
    const uint64_t off = t.U64();
    const uint64_t len = t.U64();
    const uint32_t crc = t.U32();
    t.U32();
    if (!t.ok()) return t.Fail();
    const char* name = SectionName(id);
    if (off < table_end || off > bytes.size() || len > bytes.size() - off) {
      if (off >= table_end && off <= UINT64_MAX - len) {
        return corrupt("truncated at offset " + std::to_string(bytes.size()) + ": section '" +
                       name + "' needs " + std::to_string(len) + " bytes at offset " +
                       std::to_string(off));
      }
      return corrupt("section '" + std::string(name) + "' has a bad extent (offset " +
                     std::to_string(off) + ", length " + std::to_string(len) + ")");
    }
    const std::string_view data = bytes.substr(off, len);
    const uint32_t c = Crc32(data);
    if (c != crc) {
      return corrupt("section '" + std::string(name) + "' checksum mismatch (stored " +
                     base::Hex(crc) + ", computed " + base::Hex(c) + ")");
    }
    for (const auto& [other_off, other_len, other_name] : extents) {
      if (len != 0 && other_len != 0 && off < other_off + other_len && other_off < off + len) {
        return corrupt("section '" + std::string(name) + "' [" + std::to_string(off) + ", +" +
                       std::to_string(len) + ") overlaps section '" + other_name + "' [" +
                       std::to_string(other_off) + ", +" + std::to_string(other_len) + ")");
      }
    }
    extents.emplace_back(off, len, name);
    if (id >= 1 && id <= kSectionCount) {
      if (seen[id]) return corrupt("section '" + std::string(name) + "' appears twice");
      seen[id] = true;
      sections[id] = data;
      section_base[id] = off;
    }  // unknown sections of this version are skipped
  }
  if (file_size != bytes.size()) {
    if (bytes.size() < file_size) {
      return corrupt("truncated at offset " + std::to_string(bytes.size()) +
                     ": the header says the file has " + std::to_string(file_size) + " bytes");
    }
    return corrupt(std::to_string(bytes.size() - file_size) + " trailing bytes after the end (" +
                   std::to_string(file_size) + " bytes) the header gives");
  }
  for (uint32_t id = 1; id <= kSectionCount; ++id) {
    if (!seen[id]) return corrupt("missing section '" + std::string(SectionName(id)) + "'");
  }

  Dump d;
  d.version = version;
  d.includes_guest_data = (flags & kFlagGuestData) != 0;
  const std::string_view strs = sections[kStrings];

  {
    Reader r(sections[kMeta], "meta", section_base[kMeta], origin);
    d.monotonic_ns = r.U64();
    d.realtime_ns = r.U64();
    const uint8_t src = r.U8();
    d.clock.tsc_invariant = r.U8() != 0;
    d.clock.tsc_known_freq = r.U8() != 0;
    r.U8();
    d.clock.ns_per_tick = r.F64();
    d.clock.tsc_hz = r.U64();
    d.clock.base_ticks = r.U64();
    d.clock.base_ns = r.U64();
    if (r.ok() && src > 1) r.Bad("clock source " + std::to_string(src) + " is unknown");
    d.clock.source = static_cast<ClockSource>(src & 1);
    d.slow_exit_threshold_ns = r.U64();
    d.watchdog.stuck_exit_ns = r.U64();
    d.watchdog.io_age_ns = r.U64();
    d.watchdog.poll_ns = r.U64();
    d.watchdog_running = r.U8() != 0;
    d.process.pid = r.I64();
    d.process.comm = r.Str(strs);
    const uint32_t argc = r.U32();
    if (r.Count(argc, 8, "argv")) {
      for (uint32_t i = 0; i < argc && r.ok(); ++i) d.process.argv.push_back(r.Str(strs));
    }
    d.process.start_realtime_ns = r.U64();
    for (std::string* s : {&d.host.sysname, &d.host.nodename, &d.host.release, &d.host.version,
                           &d.host.machine, &d.host.cpu_model}) {
      *s = r.Str(strs);
    }
    d.host.cpus = r.U32();
    RecorderCounters& c = d.counters;
    for (uint64_t* v : {&c.bad_vcpu, &c.end_without_begin, &c.begin_without_end, &c.slow_exits,
                        &c.findings_dropped, &c.io_inflight_overflow, &c.io_untracked_completions,
                        &c.io_in_flight}) {
      *v = r.U64();
    }
    DeviceEventCounters& e = d.device_event_counters;
    for (uint64_t* v : {&e.capacity, &e.written, &e.overwritten, &e.dropped, &e.skipped})
      *v = r.U64();
    const uint32_t nattr = r.U32();
    if (r.Count(nattr, 16, "attribute")) {
      for (uint32_t i = 0; i < nattr && r.ok(); ++i) {
        std::string k = r.Str(strs);
        std::string v = r.Str(strs);
        d.attributes.emplace_back(std::move(k), std::move(v));
      }
    }
    if (!r.ok()) return r.Fail();
  }
  {
    Reader r(sections[kDevices], "devices", section_base[kDevices], origin);
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
        d.devices.push_back(std::move(dev));
      }
    }
    if (!r.ok()) return r.Fail();
  }
  {
    Reader r(sections[kMaps], "maps", section_base[kMaps], origin);
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
        d.maps.push_back(std::move(*m));
      }
    }
    if (!r.ok()) return r.Fail();
  }
  {
    Reader r(sections[kRanges], "ranges", section_base[kRanges], origin);
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
        if (rg.device >= d.devices.size())
          r.Bad("range " + std::to_string(i) + " names device " + std::to_string(rg.device) +
                " of " + std::to_string(d.devices.size()));
        if (rg.map != kNoRegister && rg.map >= d.maps.size())
          r.Bad("range " + std::to_string(i) + " names register map " + std::to_string(rg.map));
        rg.space = static_cast<IoSpace>(space & 1);
        d.ranges.push_back(rg);
      }
    }
    if (!r.ok()) return r.Fail();
  }
  ReadIssues issues;
  // Per-record checks: what is wrong in one record is repaired in that record and counted.
  auto check_exit = [&](DumpExit& e, uint32_t vcpu) {
    if (e.device != kUnassigned && e.device >= d.devices.size()) {
      ++issues.bad_device;
      e.device = kUnassigned;
      e.reg = kNoRegister;
      e.map = kNoRegister;
    }
    if (e.map != kNoRegister && e.map >= d.maps.size()) {
      ++issues.bad_map;
      e.map = kNoRegister;
      e.reg = kNoRegister;
    }
    if (!d.includes_guest_data && (e.value != 0 || (e.flags & kExitFlagValue) != 0)) {
      ++issues.stray_guest_data;
      e.value = 0;
      e.flags &= static_cast<uint8_t>(~kExitFlagValue);
    }
    if (e.vcpu != vcpu) {
      ++issues.vcpu_mismatch;
      e.vcpu = vcpu;
    }
  };
  {
    Reader v(sections[kVcpus], "vcpus", section_base[kVcpus], origin);
    Reader x(sections[kExits], "exits", section_base[kExits], origin);
    const uint64_t total = x.U64();
    const uint64_t min_record = version >= 3   ? kMinCodedExit
                                : version == 2 ? kExitRecordSize
                                               : kExitRecordSizeV1;
    if (!x.Count(total, min_record, "exit")) return x.Fail();
    // Version 3: coded records (exit_codec.h), read straight from the section's bytes.
    const std::string_view xs = sections[kExits];
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
        if (c.counters.overwritten > c.counters.written ||
            c.counters.skipped > c.counters.written || count > c.counters.written) {
          issues.lines.push_back("vCPU " + std::to_string(i) + " ring counters cannot be true (" +
                                 std::to_string(c.counters.written) + " written, " +
                                 std::to_string(c.counters.overwritten) + " overwritten, " +
                                 std::to_string(c.counters.skipped) + " skipped, " +
                                 std::to_string(count) + " held)");
        }
        if (has == 1) {
          DumpExit e;
          if (!ReadExit(v, version, &e, &issues)) break;
          check_exit(e, c.vcpu);
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
        if (version >= 3) {
          dec.NextVcpu();
          for (uint64_t k = 0; k < count; ++k) {
            DumpExit& e = c.exits.emplace_back();
            if (!dec.Get(&xp, xend, c.vcpu, &e)) {
              coded_ok = false;
              break;
            }
            ++decoded;
            CheckRaw(&e, &issues);
            check_exit(e, c.vcpu);
          }
          if (!coded_ok) break;
        } else {
          for (uint64_t k = 0; k < count && x.ok(); ++k) {
            DumpExit e;
            if (!ReadExit(x, version, &e, &issues)) break;
            check_exit(e, c.vcpu);
            c.exits.push_back(e);
          }
        }
        d.vcpus.push_back(std::move(c));
      }
    }
    if (!v.ok()) return v.Fail();
    if (!x.ok()) return x.Fail();
    if (!coded_ok) {
      return corrupt("section 'exits' is corrupt at offset " +
                     std::to_string(section_base[kExits] + static_cast<uint64_t>(xp - xs.data())) +
                     ": exit record " + std::to_string(decoded) + ": " + dec.why());
    }
    if (version >= 3 && xp != xend) {
      return corrupt("section 'exits' has " + std::to_string(xend - xp) +
                     " bytes after its last exit record (offset " +
                     std::to_string(section_base[kExits] + static_cast<uint64_t>(xp - xs.data())) +
                     ")");
    }
    if (consumed != total) {
      return corrupt("section 'exits' holds " + std::to_string(total) +
                     " exits but the vCPUs account for " + std::to_string(consumed));
    }
  }
  {
    Reader r(sections[kDeviceEvents], "device_events", section_base[kDeviceEvents], origin);
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
          issues.lines.push_back("device event " + std::to_string(i) + " has unknown type " +
                                 std::to_string(type) + "; skipped");
          continue;
        }
        e.type = static_cast<DeviceEventType>(type);
        d.device_events.push_back(std::move(e));
      }
    }
    if (!r.ok()) return r.Fail();
  }
  {
    Reader r(sections[kFindings], "findings", section_base[kFindings], origin);
    const uint32_t n = r.U32();
    if (r.Count(n, 64, "finding")) {
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
        if (type > static_cast<uint8_t>(FindingType::kSlowExit)) {
          ++issues.unknown_finding;
          continue;  // a finding of a type this reader cannot name: counted, not shown
        }
        if (kind >= kExitKindCount) issues.Kind(kind);
        if (dir > 2) issues.Dir(dir);
        f.type = static_cast<FindingType>(type);
        f.kind = static_cast<ExitKind>(kind);
        f.dir = dir > 2 ? AccessDir::kNone : static_cast<AccessDir>(dir);
        if (f.device != kUnassigned && f.device >= d.devices.size()) {
          ++issues.bad_device;
          f.device = kUnassigned;
          f.reg = kNoRegister;
        }
        d.findings.push_back(std::move(f));
      }
    }
    if (!r.ok()) return r.Fail();
  }

  // Values that cannot be true, and strings JSON cannot carry as they are.
  if (!std::isfinite(d.clock.ns_per_tick) || d.clock.ns_per_tick < 0) {
    issues.lines.push_back("clock calibration ns_per_tick is " +
                           std::to_string(d.clock.ns_per_tick) +
                           "; ignored (the dump's times are already in ns)");
    d.clock.ns_per_tick = 0;
  }
  auto utf8 = [&](const std::string& str) { issues.bad_utf8 += base::IsUtf8(str) ? 0 : 1; };
  utf8(d.process.comm);
  for (const std::string& a : d.process.argv) utf8(a);
  for (const std::string* h : {&d.host.sysname, &d.host.nodename, &d.host.release, &d.host.version,
                               &d.host.machine, &d.host.cpu_model}) {
    utf8(*h);
  }
  for (const auto& [k, val] : d.attributes) {
    utf8(k);
    utf8(val);
  }
  for (const DeviceInfo& dev : d.devices) {
    utf8(dev.name);
    utf8(dev.kind);
  }
  for (const DumpDeviceEvent& e : d.device_events) utf8(e.note);
  for (const FindingRecord& f : d.findings) utf8(f.text);
  for (const DumpVcpu& c : d.vcpus) {
    for (const auto& [name, val] : c.named_counters) utf8(name);
  }

  auto n = [](uint64_t v, const char* one, const char* many) {
    return std::to_string(v) + " " + (v == 1 ? one : many);
  };
  if (issues.unknown_kind != 0) {
    d.warnings.push_back(n(issues.unknown_kind, "record has", "records have") +
                         " an unknown exit kind (first: " + std::to_string(issues.first_kind) +
                         "); shown as kind#" + std::to_string(issues.first_kind));
  }
  if (issues.unknown_dir != 0) {
    d.warnings.push_back(n(issues.unknown_dir, "record has", "records have") +
                         " an unknown access direction (first: " +
                         std::to_string(issues.first_dir) + "); shown as none");
  }
  if (issues.bad_device != 0) {
    d.warnings.push_back(n(issues.bad_device, "record names", "records name") +
                         " a device the dump does not have; shown as unassigned");
  }
  if (issues.bad_map != 0) {
    d.warnings.push_back(n(issues.bad_map, "exit names", "exits name") +
                         " a register map the dump does not have; shown without a register");
  }
  if (issues.stray_guest_data != 0) {
    d.warnings.push_back(n(issues.stray_guest_data, "exit carries", "exits carry") +
                         " guest data although the dump says it holds none; values dropped");
  }
  if (issues.vcpu_mismatch != 0) {
    d.warnings.push_back(n(issues.vcpu_mismatch, "exit names", "exits name") +
                         " another vCPU than the one it is stored under; shown under its own");
  }
  if (issues.unknown_finding != 0) {
    d.warnings.push_back(n(issues.unknown_finding, "finding has", "findings have") +
                         " an unknown type; skipped");
  }
  if (issues.bad_utf8 != 0) {
    d.warnings.push_back(n(issues.bad_utf8, "string is", "strings are") +
                         " not valid UTF-8 (argv, comm, attributes, notes...); JSON output "
                         "shows the bad bytes as U+FFFD");
  }
  for (std::string& l : issues.lines) d.warnings.push_back(std::move(l));
  return d;
}

Result<Dump> ReadDump(const std::string& path) {
  // Size checks come before any read: a device (/dev/zero), FIFO or directory has no size to
  // trust, and a regular file larger than any dump is refused without reading it.
  auto bytes = base::ReadBoundedFile(path, kMaxDumpFileBytes, "dump", ErrorCode::kCorrupt);
  if (!bytes) return Propagate(bytes);
  return ParseDump(*bytes, path);
}
}  // namespace exitscope
