#include "base/hash.h"

#include <gtest/gtest.h>

#include <bit>
#include <set>

namespace exitscope::base {
namespace {

// splitmix64's published outputs for seed 0 (state advancing by the gamma each call).
TEST(SplitMix64, MatchesTheReferenceSequence) {
  EXPECT_EQ(SplitMix64(0), 0xe220a8397b1dcdafull);
  EXPECT_EQ(SplitMix64(kGoldenGamma), 0x6e789e6aa1b965f4ull);
  EXPECT_EQ(SplitMix64(2 * kGoldenGamma), 0x06c45d188009454full);
}

TEST(SplitMix64, OneInputBitChangesAboutHalfTheOutput) {
  int total = 0;
  for (int bit = 0; bit < 64; ++bit)
    total += std::popcount(SplitMix64(0x1000) ^ SplitMix64(0x1000 ^ (1ull << bit)));
  EXPECT_GT(total, 64 * 24);
  EXPECT_LT(total, 64 * 40);
}

TEST(HashPair, OrderMattersAndPairsDiffer) {
  EXPECT_NE(HashPair(1, 2), HashPair(2, 1));
  std::set<uint64_t> seen;
  for (uint64_t a = 0; a < 64; ++a)
    for (uint64_t b = 0; b < 64; ++b) seen.insert(HashPair(a, b));
  EXPECT_EQ(seen.size(), 64u * 64u);
}

}  // namespace
}  // namespace exitscope::base
