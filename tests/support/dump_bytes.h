// tests/support/dump_bytes.h: reading and patching a dump file's bytes in tests that damage
// dumps on purpose (tests/recorder/dump_test.cc, dump_stacks_test.cc). The CRC here is a plain
// bitwise one, independent of base/crc32 (which the code under test uses).
#pragma once

#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>

namespace exitscope::test {

inline uint32_t Crc32(std::string_view d) {
  uint32_t c = 0xffffffffu;
  for (unsigned char b : d) {
    c ^= b;
    for (int k = 0; k < 8; ++k) c = (c & 1) ? 0xedb88320u ^ (c >> 1) : c >> 1;
  }
  return c ^ 0xffffffffu;
}
inline uint32_t Le32(std::string_view s, size_t at) {
  uint32_t v;
  std::memcpy(&v, s.data() + at, 4);
  return v;
}
inline uint64_t Le64(std::string_view s, size_t at) {
  uint64_t v;
  std::memcpy(&v, s.data() + at, 8);
  return v;
}
inline void Put32(std::string& s, size_t at, uint32_t v) {
  std::memcpy(s.data() + at, &v, 4);
}
inline void Put64(std::string& s, size_t at, uint64_t v) {
  std::memcpy(s.data() + at, &v, 8);
}

}  // namespace exitscope::test
