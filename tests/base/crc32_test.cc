// CRC-32 of the dump format: the PCLMULQDQ and slice-by-8 paths give the bytewise table's
// result for every length and every way of cutting the input.
#include "base/crc32.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <random>
#include <string>
#include <vector>

namespace exitscope::base {
namespace {

std::vector<unsigned char> RandomBytes(size_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<unsigned char> v(n);
  for (auto& b : v) b = static_cast<unsigned char>(rng());
  return v;
}

TEST(Crc32Test, KnownValues) {
  // The CRC-32 check value (zlib crc32 of "123456789"), and of the empty string.
  EXPECT_EQ(Crc32Of("123456789"), 0xcbf43926u);
  EXPECT_EQ(Crc32Of(""), 0u);
  const std::string zeros(4096, '\0');
  EXPECT_EQ(Crc32Of(zeros), Crc32ExtendBytewise(0, zeros.data(), zeros.size()));
  std::printf("PCLMULQDQ path on this CPU: %s\n", Crc32UsesClmul() ? "yes" : "no");
}

TEST(Crc32Test, EveryLengthMatchesBytewise) {
  const std::vector<unsigned char> data = RandomBytes(4096 + 77, 1);
  for (size_t n = 0; n <= data.size(); n += (n < 600 ? 1 : 97)) {
    const uint32_t want = Crc32ExtendBytewise(0, data.data(), n);
    ASSERT_EQ(Crc32Extend(0, data.data(), n), want) << "length " << n;
    ASSERT_EQ(Crc32ExtendSlice8(0, data.data(), n), want) << "length " << n;
  }
}

TEST(Crc32Test, UnalignedStartsMatchBytewise) {
  const std::vector<unsigned char> data = RandomBytes(1024, 2);
  for (size_t off = 0; off < 32; ++off) {
    const size_t n = data.size() - off;
    ASSERT_EQ(Crc32Extend(0, data.data() + off, n), Crc32ExtendBytewise(0, data.data() + off, n))
        << "offset " << off;
  }
}

TEST(Crc32Test, AnyCutsGiveTheSameResult) {
  const std::vector<unsigned char> data = RandomBytes(1 << 20, 3);
  const uint32_t want = Crc32ExtendBytewise(0, data.data(), data.size());
  std::mt19937_64 rng(4);
  for (int trial = 0; trial < 50; ++trial) {
    uint32_t crc = 0;
    size_t at = 0;
    while (at < data.size()) {
      const size_t piece = std::min<size_t>(data.size() - at, rng() % (trial < 25 ? 300 : 70000));
      crc = Crc32Extend(crc, data.data() + at, piece);
      at += piece;
    }
    ASSERT_EQ(crc, want) << "trial " << trial;
  }
}

}  // namespace
}  // namespace exitscope::base
