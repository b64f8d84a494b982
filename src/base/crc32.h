// base/crc32.h: CRC-32 (IEEE 802.3, reflected polynomial 0xedb88320, as zlib's crc32),
// the checksum of the dump format (docs/dump-format.md). Not public API.
//
// Crc32Extend works like zlib's crc32(crc, buf, len): start from 0 and feed the bytes in any
// number of pieces, cut anywhere; the result does not depend on the cuts. It folds 64 bytes at
// a time with PCLMULQDQ where the CPU has it (checked once at run time: the library is built
// for plain x86-64), else slice-by-8 tables; both give the bytewise table's result
// (tests/recorder/crc32_test.cc).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>

namespace exitscope::base {

uint32_t Crc32Extend(uint32_t crc, const void* data, size_t size) noexcept;

inline uint32_t Crc32Of(std::string_view data) noexcept {
  return Crc32Extend(0, data.data(), data.size());
}

// The CRC of A followed by B from crc_a = CRC(A), crc_b = CRC(B) and len_b = |B| (as zlib's
// crc32_combine): O(log len_b), so a section whose first bytes are known last (the exits
// count of a streamed dump) is checksummed in one pass over the rest.
uint32_t Crc32Combine(uint32_t crc_a, uint32_t crc_b, uint64_t len_b) noexcept;

// The portable paths, exposed for the tests: one byte at a time, and slice-by-8.
uint32_t Crc32ExtendBytewise(uint32_t crc, const void* data, size_t size) noexcept;
uint32_t Crc32ExtendSlice8(uint32_t crc, const void* data, size_t size) noexcept;
// True when Crc32Extend uses PCLMULQDQ on this CPU.
bool Crc32UsesClmul() noexcept;

}  // namespace exitscope::base
