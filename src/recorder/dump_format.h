// recorder/dump_format.h: the dump file's layout constants, section ids and CRC32, shared by
// the writer (dump_writer.cc) and the reader (dump_reader.cc, dump_reader_sections.cc). Not
// public API; the format is docs/dump-format.md.
#pragma once

#include <array>
#include <cstdint>
#include <string_view>

#include "base/crc32.h"

namespace exitscope::internal {

constexpr uint32_t kHeaderSize = 64;
constexpr uint32_t kSectionEntrySize = 32;
// An exit record: 60 bytes since version 2 (u32 map index appended), 56 in version 1.
constexpr uint32_t kExitRecordSize = 60;
constexpr uint32_t kExitRecordSizeV1 = 56;
constexpr uint32_t kFlagGuestData = 1;

enum SectionId : uint32_t {
  kStrings = 1,
  kMeta = 2,
  kDevices = 3,
  kMaps = 4,
  kRanges = 5,
  kVcpus = 6,
  kExits = 7,
  kDeviceEvents = 8,
  kFindings = 9,
  kStacks = 10,  // since version 4
};
constexpr uint32_t kSectionCount = 10;
// The first version with each section: a file of an older version has none of the sections
// that came later (versions 1..3 have no `stacks`).
inline constexpr uint32_t FirstVersionOf(uint32_t id) {
  return id == kStacks ? 4 : 1;
}

inline const char* SectionName(uint32_t id) {
  switch (id) {
    case kStrings:
      return "strings";
    case kMeta:
      return "meta";
    case kDevices:
      return "devices";
    case kMaps:
      return "maps";
    case kRanges:
      return "ranges";
    case kVcpus:
      return "vcpus";
    case kExits:
      return "exits";
    case kDeviceEvents:
      return "device_events";
    case kFindings:
      return "findings";
    case kStacks:
      return "stacks";
  }
  return "unknown";
}

// CRC-32 (IEEE, as zlib's crc32) of a whole section or header (crc32.h: PCLMULQDQ when the
// CPU has it).
inline uint32_t Crc32(std::string_view data) {
  return base::Crc32Of(data);
}

}  // namespace exitscope::internal
