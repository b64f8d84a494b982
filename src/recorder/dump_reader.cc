// recorder/dump_reader.cc: ParseDump (bounds-checked, every section's CRC32 verified, corrupt
// input named by section and offset) and ReadDump (regular files only, size-bounded before any
// read). The header and the section table are read here, then each section by its own reader
// (dump_reader_sections.cc), then what they found is turned into the dump's warnings.
#include <cmath>
#include <cstring>
#include <string>
#include <tuple>
#include <vector>

#include "base/file_read.h"
#include "base/text.h"
#include "exitscope/dump.h"
#include "recorder/dump_format.h"
#include "recorder/dump_reader_sections.h"

namespace exitscope {

using namespace internal;  // dump_format.h, text.h
using namespace internal::dump_read;

namespace {

// What the header says (ReadHeader).
struct DumpHeader {
  uint32_t version = 0;
  uint32_t flags = 0;
  uint32_t section_count = 0;
  uint64_t file_size = 0;
  uint32_t table_crc = 0;
};

// The header: magic, version, its own checksum, size and flags, a plausible section count.
Result<DumpHeader> ReadHeader(std::string_view bytes, std::string_view origin) {
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
  return DumpHeader{version, flags, nsec, file_size, table_crc};
}

// The section table: every section inside the file, its checksum right, no two overlapping, none
// twice, none missing; the file's size the header's.
Status ReadSectionTable(std::string_view bytes, const DumpHeader& header, DumpView* view) {
  const uint64_t table_end =
      kHeaderSize + static_cast<uint64_t>(header.section_count) * kSectionEntrySize;
  if (bytes.size() < table_end) {
    return view->Corrupt("truncated at offset " + std::to_string(bytes.size()) +
                         ": the section table needs " + std::to_string(table_end) + " bytes");
  }
  const std::string_view table = bytes.substr(kHeaderSize, table_end - kHeaderSize);
  if (Crc32(table) != header.table_crc) return view->Corrupt("section table checksum mismatch");
  bool seen[kSectionCount + 1] = {};
  Reader t(table, "section table", kHeaderSize, view->origin);
  std::vector<std::tuple<uint64_t, uint64_t, const char*>> extents;  // offset, length, name
  for (uint32_t i = 0; i < header.section_count; ++i) {
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
        return view->Corrupt("truncated at offset " + std::to_string(bytes.size()) + ": section '" +
                             name + "' needs " + std::to_string(len) + " bytes at offset " +
                             std::to_string(off));
      }
      return view->Corrupt("section '" + std::string(name) + "' has a bad extent (offset " +
                           std::to_string(off) + ", length " + std::to_string(len) + ")");
    }
    const std::string_view data = bytes.substr(off, len);
    const uint32_t c = Crc32(data);
    if (c != crc) {
      return view->Corrupt("section '" + std::string(name) + "' checksum mismatch (stored " +
                           base::Hex(crc) + ", computed " + base::Hex(c) + ")");
    }
    for (const auto& [other_off, other_len, other_name] : extents) {
      if (len != 0 && other_len != 0 && off < other_off + other_len && other_off < off + len) {
        return view->Corrupt("section '" + std::string(name) + "' [" + std::to_string(off) + ", +" +
                             std::to_string(len) + ") overlaps section '" + other_name + "' [" +
                             std::to_string(other_off) + ", +" + std::to_string(other_len) + ")");
      }
    }
    extents.emplace_back(off, len, name);
    if (id >= 1 && id <= kSectionCount) {
      if (seen[id]) return view->Corrupt("section '" + std::string(name) + "' appears twice");
      seen[id] = true;
      view->data[id] = data;
      view->offset[id] = off;
    }  // unknown sections of this version are skipped
  }
  if (header.file_size != bytes.size()) {
    if (bytes.size() < header.file_size) {
      return view->Corrupt("truncated at offset " + std::to_string(bytes.size()) +
                           ": the header says the file has " + std::to_string(header.file_size) +
                           " bytes");
    }
    return view->Corrupt(std::to_string(bytes.size() - header.file_size) +
                         " trailing bytes after the end (" + std::to_string(header.file_size) +
                         " bytes) the header gives");
  }
  for (uint32_t id = 1; id <= kSectionCount; ++id) {
    view->present[id] = seen[id];
    // A section newer than the file's version is absent (versions 1..3 have no `stacks`).
    if (!seen[id] && header.version >= FirstVersionOf(id)) {
      return view->Corrupt("missing section '" + std::string(SectionName(id)) + "'");
    }
  }
  return {};
}

// Values that cannot be true, and strings JSON cannot carry as they are: repaired or counted.
void CheckValues(Dump* d, ReadIssues* issues) {
  if (!std::isfinite(d->clock.ns_per_tick) || d->clock.ns_per_tick < 0) {
    issues->lines.push_back("clock calibration ns_per_tick is " +
                            std::to_string(d->clock.ns_per_tick) +
                            "; ignored (the dump's times are already in ns)");
    d->clock.ns_per_tick = 0;
  }
  auto utf8 = [&](const std::string& str) { issues->bad_utf8 += base::IsUtf8(str) ? 0 : 1; };
  utf8(d->process.comm);
  for (const std::string& a : d->process.argv) utf8(a);
  for (const std::string* h : {&d->host.sysname, &d->host.nodename, &d->host.release,
                               &d->host.version, &d->host.machine, &d->host.cpu_model}) {
    utf8(*h);
  }
  for (const auto& [k, val] : d->attributes) {
    utf8(k);
    utf8(val);
  }
  for (const DeviceInfo& dev : d->devices) {
    utf8(dev.name);
    utf8(dev.kind);
  }
  for (const DumpDeviceEvent& e : d->device_events) utf8(e.note);
  for (const FindingRecord& f : d->findings) utf8(f.text);
  for (const DumpVcpu& c : d->vcpus) {
    for (const auto& [name, val] : c.named_counters) utf8(name);
  }
  for (const FindingRecord& f : d->findings) {
    utf8(f.stack.note);
    for (const std::vector<StackFrame>* frames : {&f.stack.user, &f.stack.kernel}) {
      for (const StackFrame& fr : *frames) {
        utf8(fr.function);
        utf8(fr.module);
        utf8(fr.file);
      }
    }
  }
}

// What the readers found wrong but read past, as the dump's warnings.
void AddWarnings(ReadIssues* issues, Dump* d) {
  auto n = [](uint64_t v, const char* one, const char* many) {
    return std::to_string(v) + " " + (v == 1 ? one : many);
  };
  if (issues->unknown_kind != 0) {
    d->warnings.push_back(n(issues->unknown_kind, "record has", "records have") +
                          " an unknown exit kind (first: " + std::to_string(issues->first_kind) +
                          "); shown as kind#" + std::to_string(issues->first_kind));
  }
  if (issues->unknown_dir != 0) {
    d->warnings.push_back(n(issues->unknown_dir, "record has", "records have") +
                          " an unknown access direction (first: " +
                          std::to_string(issues->first_dir) + "); shown as none");
  }
  if (issues->bad_device != 0) {
    d->warnings.push_back(n(issues->bad_device, "record names", "records name") +
                          " a device the dump does not have; shown as unassigned");
  }
  if (issues->bad_map != 0) {
    d->warnings.push_back(n(issues->bad_map, "exit names", "exits name") +
                          " a register map the dump does not have; shown without a register");
  }
  if (issues->stray_guest_data != 0) {
    d->warnings.push_back(n(issues->stray_guest_data, "exit carries", "exits carry") +
                          " guest data although the dump says it holds none; values dropped");
  }
  if (issues->vcpu_mismatch != 0) {
    d->warnings.push_back(n(issues->vcpu_mismatch, "exit names", "exits name") +
                          " another vCPU than the one it is stored under; shown under its own");
  }
  if (issues->unknown_finding != 0) {
    d->warnings.push_back(n(issues->unknown_finding, "finding has", "findings have") +
                          " an unknown type; skipped");
  }
  if (issues->bad_utf8 != 0) {
    d->warnings.push_back(
        n(issues->bad_utf8, "string is", "strings are") +
        " not valid UTF-8 (argv, comm, attributes, notes, frames...); JSON output "
        "shows the bad bytes as U+FFFD");
  }
  for (std::string& l : issues->lines) d->warnings.push_back(std::move(l));
}

}  // namespace

Result<Dump> ParseDump(std::string_view bytes, std::string_view origin) {
  auto header = ReadHeader(bytes, origin);
  if (!header) return Propagate(header);
  DumpView view;
  view.origin = origin;
  view.version = header->version;
  if (Status st = ReadSectionTable(bytes, *header, &view); !st) return Propagate(st);

  Dump d;
  d.version = header->version;
  d.includes_guest_data = (header->flags & kFlagGuestData) != 0;
  ReadIssues issues;
  // In this order: each section is checked against those read before it.
  for (const SectionReaderFn read : {ReadMeta, ReadDevices, ReadMaps, ReadRanges, ReadVcpusAndExits,
                                     ReadDeviceEvents, ReadFindings, ReadStacks}) {
    if (Status st = read(view, &d, &issues); !st) return Propagate(st);
  }
  CheckValues(&d, &issues);
  AddWarnings(&issues, &d);
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
