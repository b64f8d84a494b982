// recorder/dump_reader_sections.h: the inside of the dump reader, shared by its two files:
// dump_reader.cc (ParseDump: the header and the section table, then one reader per section,
// then the warnings; ReadDump) and dump_reader_sections.cc (the readers of the sections, one
// function each). Not public API; the format is docs/dump-format.md.
#pragma once

#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>
#include <vector>

#include "exitscope/dump.h"
#include "exitscope/status.h"
#include "recorder/dump_format.h"

namespace exitscope::internal::dump_read {

// Reads little-endian fields of one section (or the header, or the section table). The first
// short read or Bad() makes it fail, with a message naming the file, the section and the
// offset in the file; reads after that return 0.
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
  // Not an issue: where each finding of the file went in Dump::findings (kSkippedFinding for
  // one of an unknown type), so that the `stacks` section can name findings by file index.
  static constexpr uint32_t kSkippedFinding = UINT32_MAX;
  std::vector<uint32_t> finding_at;

  void Kind(uint8_t k) {
    if (unknown_kind++ == 0) first_kind = k;
  }
  void Dir(uint8_t d) {
    if (unknown_dir++ == 0) first_dir = d;
  }
};

// The sections of one dump, checked against the file (ParseDump), and what every section reader
// needs besides its own bytes.
struct DumpView {
  std::string_view origin;                   // the file, for messages
  uint32_t version = 0;                      // the dump's format version
  std::string_view data[kSectionCount + 1];  // by SectionId; [0] is unused
  uint64_t offset[kSectionCount + 1] = {};   // where each section starts in the file
  bool present[kSectionCount + 1] = {};      // false only for a section newer than the file

  std::string_view strings() const { return data[kStrings]; }
  // A reader of section `id`, its errors named by the section and its offsets in the file.
  Reader Open(SectionId id) const { return Reader(data[id], SectionName(id), offset[id], origin); }
  // kCorrupt: "ORIGIN: why".
  Unexpected Corrupt(const std::string& why) const {
    return exitscope::Fail(ErrorCode::kCorrupt, std::string(origin) + ": " + why);
  }
};

// The section readers (dump_reader_sections.cc), in the order ParseDump calls them: each reads
// its section into `d`, checked against what the sections before it put there (a range names
// a device and a register map, an exit a device, a map and its vCPU). What is wrong in one
// record is repaired and counted in `issues`; what makes the section unreadable fails it,
// kCorrupt, naming the section and the offset.
using SectionReaderFn = Status (*)(const DumpView& sections, Dump* d, ReadIssues* issues);
Status ReadMeta(const DumpView& sections, Dump* d, ReadIssues* issues);
Status ReadDevices(const DumpView& sections, Dump* d, ReadIssues* issues);
Status ReadMaps(const DumpView& sections, Dump* d, ReadIssues* issues);
Status ReadRanges(const DumpView& sections, Dump* d, ReadIssues* issues);
// `vcpus` and `exits` together: a vCPU entry says how many of the exits that follow in
// `exits` are its own.
Status ReadVcpusAndExits(const DumpView& sections, Dump* d, ReadIssues* issues);
Status ReadDeviceEvents(const DumpView& sections, Dump* d, ReadIssues* issues);
Status ReadFindings(const DumpView& sections, Dump* d, ReadIssues* issues);
// `stacks` (version 4 on; nothing in older files): the vCPUs' thread ids, the stack counters
// and the findings' stacks, each naming its finding by its index in the `findings` section.
Status ReadStacks(const DumpView& sections, Dump* d, ReadIssues* issues);

}  // namespace exitscope::internal::dump_read
