// recorder/text.h: small text formatters shared by the recorder's files and the layers above
// (src/analysis links exitscope_recorder). Not public API.
#pragma once

#include <cinttypes>
#include <cstdint>
#include <cstdio>
#include <string>
#include <string_view>

namespace exitscope::internal {

// "0x1f", "0x0": lowercase hex with a 0x prefix, for addresses, offsets, flags and checksums
// in messages.
inline std::string Hex(uint64_t v) {
  char buf[24];
  std::snprintf(buf, sizeof buf, "0x%" PRIx64, v);
  return buf;
}

// The length of the valid UTF-8 sequence at s[i] (i < s.size()), 0 when it is not one:
// overlong forms, surrogates and code points past U+10FFFF are invalid.
inline size_t Utf8SequenceLength(std::string_view s, size_t i) noexcept {
  const auto b = [&](size_t k) { return static_cast<unsigned char>(s[k]); };
  const unsigned char c = b(i);
  size_t n;
  uint32_t cp;
  if (c < 0x80) return 1;
  if (c >= 0xc2 && c <= 0xdf) {
    n = 2, cp = c & 0x1f;
  } else if (c >= 0xe0 && c <= 0xef) {
    n = 3, cp = c & 0x0f;
  } else if (c >= 0xf0 && c <= 0xf4) {
    n = 4, cp = c & 0x07;
  } else {
    return 0;
  }
  if (i + n > s.size()) return 0;
  for (size_t k = 1; k < n; ++k) {
    if ((b(i + k) & 0xc0) != 0x80) return 0;
    cp = (cp << 6) | (b(i + k) & 0x3f);
  }
  if ((n == 3 && (cp < 0x800 || (cp >= 0xd800 && cp <= 0xdfff))) ||
      (n == 4 && (cp < 0x10000 || cp > 0x10ffff))) {
    return 0;
  }
  return n;
}

// True when `s` is valid UTF-8.
inline bool IsUtf8(std::string_view s) noexcept {
  for (size_t i = 0; i < s.size();) {
    const size_t n = Utf8SequenceLength(s, i);
    if (n == 0) return false;
    i += n;
  }
  return true;
}

}  // namespace exitscope::internal
