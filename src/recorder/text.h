// recorder/text.h: small text formatters shared by the recorder's files and the layers above
// (src/analysis links exitscope_recorder). Not public API.
#pragma once

#include <cinttypes>
#include <cstdint>
#include <cstdio>
#include <string>

namespace exitscope::internal {

// "0x1f", "0x0": lowercase hex with a 0x prefix, for addresses, offsets, flags and checksums
// in messages.
inline std::string Hex(uint64_t v) {
  char buf[24];
  std::snprintf(buf, sizeof buf, "0x%" PRIx64, v);
  return buf;
}

}  // namespace exitscope::internal
