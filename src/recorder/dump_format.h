// recorder/dump_format.h: the dump file's layout constants, section ids and CRC32, shared by
// the writer (dump_writer.cc) and the reader (dump_reader.cc). Not public API; the format is
// docs/dump-format.md.
#pragma once

#include <array>
#include <cstdint>
#include <string_view>

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
};
constexpr uint32_t kSectionCount = 9;

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
  }
  return "unknown";
}

inline uint32_t Crc32(std::string_view data) {
  static const std::array<uint32_t, 256> table = [] {
    std::array<uint32_t, 256> t{};
    for (uint32_t i = 0; i < 256; ++i) {
      uint32_t c = i;
      for (int k = 0; k < 8; ++k) c = (c & 1) ? 0xedb88320u ^ (c >> 1) : c >> 1;
      t[i] = c;
    }
    return t;
  }();
  uint32_t c = 0xffffffffu;
  for (unsigned char b : data) c = table[(c ^ b) & 0xff] ^ (c >> 8);
  return c ^ 0xffffffffu;
}

}  // namespace exitscope::internal
