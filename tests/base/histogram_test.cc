#include "base/histogram.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <vector>

namespace exitscope::base {
namespace {

TEST(LatencyHistogram, BucketsAreContiguousAndCoverTheRange) {
  using H = LatencyHistogram;
  for (size_t b = 0; b + 1 < H::kBuckets; ++b) {
    ASSERT_EQ(H::BucketHigh(b) + 1, H::BucketLow(b + 1)) << "bucket " << b;
    ASSERT_EQ(H::BucketOf(H::BucketLow(b)), b);
    ASSERT_EQ(H::BucketOf(H::BucketHigh(b)), b);
  }
  EXPECT_EQ(H::BucketHigh(H::kBuckets - 1), ~uint64_t{0});
}

TEST(LatencyHistogram, SmallValuesAreExact) {
  LatencyHistogram h;
  for (uint64_t v = 1; v <= 100; ++v) h.Add(v);
  EXPECT_EQ(h.Quantile(0.5), 50u);
  EXPECT_EQ(h.Quantile(0.99), 99u);
  EXPECT_EQ(h.Quantile(1.0), 100u);
  EXPECT_EQ(h.min(), 1u);
}

TEST(LatencyHistogram, QuantilesWithinStatedRelativeError) {
  std::mt19937_64 rng(42);
  std::lognormal_distribution<double> dist(10.0, 2.0);
  std::vector<uint64_t> v;
  LatencyHistogram h;
  for (int i = 0; i < 100000; ++i) {
    const auto x = static_cast<uint64_t>(dist(rng)) + 1;
    v.push_back(x);
    h.Add(x);
  }
  std::sort(v.begin(), v.end());
  for (double q : {0.5, 0.9, 0.99, 0.999}) {
    const uint64_t exact = v[static_cast<size_t>(std::ceil(q * v.size())) - 1];
    const double got = static_cast<double>(h.Quantile(q));
    EXPECT_NEAR(got, static_cast<double>(exact),
                static_cast<double>(exact) * LatencyHistogram::kMaxRelativeError + 1)
        << "q=" << q;
  }
}

TEST(LatencyStats, StandardErrorMatchesPerfDefinition) {
  LatencyStats s;
  for (uint64_t x : {10, 20, 30, 40}) s.Add(x);
  // mean 25, sample variance 166.67, sem = sqrt(166.67/4) = 6.455, relative 25.82%
  EXPECT_NEAR(s.RelStdErrPercent(), 25.82, 0.01);
  LatencyStats a, b;
  a.Add(10);
  a.Add(20);
  b.Add(30);
  b.Add(40);
  a.Merge(b);
  EXPECT_NEAR(a.RelStdErrPercent(), s.RelStdErrPercent(), 1e-9);
  EXPECT_EQ(a.sum(), 100u);
  EXPECT_EQ(a.max(), 40u);
}

}  // namespace
}  // namespace exitscope::base
