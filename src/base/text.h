// base/text.h: text every layer needs: hex numbers for messages, UTF-8 validation, and the one
// line splitter. Knows nothing of exits. Not public API.
//
//   base::LineSplitter lines(text);
//   for (std::string_view line; lines.Next(&line);)
//     if (bad(line)) return Fail(..., fmt::format("{}:{}: ...", origin, lines.number()));
#pragma once

#include <cinttypes>
#include <cstdint>
#include <cstdio>
#include <string>
#include <string_view>

namespace exitscope::base {

// a == b for the short texts of a hot path (the diagnosis's causes: "IO", "nvme0.SQ1TDBL
// write"): a byte loop, where std::string_view's == calls memcmp. In the diagnosis of the
// tiled capture of docs/trace-files.md it saved 3 M of 818 M instructions.
inline bool SameShortText(std::string_view a, std::string_view b) noexcept {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i) {
    if (a[i] != b[i]) return false;
  }
  return true;
}

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

// Splits text into lines at '\n'. A line is returned without its '\n' and without one '\r'
// before it (CRLF files read as LF ones); the text after the last '\n', when not empty, is a
// last line; a trailing '\n' adds no empty line. The views point into the text given.
class LineSplitter {
 public:
  explicit LineSplitter(std::string_view text) noexcept : rest_(text) {}
  // The next line into *line; false once the text is used up.
  bool Next(std::string_view* line) noexcept {
    if (rest_.empty()) return false;
    const size_t nl = rest_.find('\n');
    std::string_view l = rest_.substr(0, nl);
    rest_.remove_prefix(nl == std::string_view::npos ? rest_.size() : nl + 1);
    if (!l.empty() && l.back() == '\r') l.remove_suffix(1);
    *line = l;
    ++number_;
    return true;
  }
  // The 1-based number of the line Next returned last (0 before the first).
  size_t number() const noexcept { return number_; }
  // What Next has not returned yet.
  std::string_view rest() const noexcept { return rest_; }

 private:
  std::string_view rest_;
  size_t number_ = 0;
};

}  // namespace exitscope::base
