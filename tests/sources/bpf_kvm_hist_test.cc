// The histograms of `kvm stat --bpf`: the BPF program's bucket function is LatencyHistogram's,
// value for value, and LatencyStats::MergeBuckets of the kernel's raw counts (buckets, sum,
// min, max, sum of squares) gives what Add()ing every value gives: count, sum, min, max,
// mean, standard error and every percentile.
#include <linux/types.h>

#include <cstdint>
#include <map>
#include <random>
#include <utility>
#include <vector>

#include "base/histogram.h"
#include "gtest/gtest.h"

extern "C" {
#include "sources/bpf/kvm_stat_hist.h"
}

namespace exitscope::analysis {
namespace {

using base::LatencyHistogram;
using base::LatencyStats;

TEST(BpfKvmHist, BucketOfIsLatencyHistogramsForEveryEdge) {
  static_assert(KS_HIST_BUCKETS == LatencyHistogram::kBuckets);
  std::vector<uint64_t> values = {0, 1, 127, 128, 129, 255, 256, 257, ~0ull, ~0ull - 1};
  for (int bit = 0; bit < 64; ++bit) {
    const uint64_t p = uint64_t{1} << bit;
    for (uint64_t v : {p - 1, p, p + 1, p + p / 3, p + p / 2}) values.push_back(v);
  }
  for (size_t b = 0; b < LatencyHistogram::kBuckets; ++b) {
    values.push_back(LatencyHistogram::BucketLow(b));
    values.push_back(LatencyHistogram::BucketHigh(b));
  }
  std::mt19937_64 rng(42);
  for (int i = 0; i < 100000; ++i) values.push_back(rng() >> (rng() % 64));
  for (uint64_t v : values) {
    ASSERT_EQ(ks_bucket_of(v), LatencyHistogram::BucketOf(v)) << v;
  }
}

// What the kernel keeps for a set of durations.
struct Raw {
  std::map<uint32_t, uint64_t> buckets;
  uint64_t sum = 0, min = ~0ull, max = 0;
  long double sum_sq = 0;
  void Add(uint64_t d) {
    ++buckets[ks_bucket_of(d)];
    sum += d;
    min = std::min(min, d);
    max = std::max(max, d);
    sum_sq += static_cast<long double>(d) * static_cast<long double>(d);
  }
  std::vector<std::pair<uint32_t, uint64_t>> Pairs() const {
    return {buckets.begin(), buckets.end()};
  }
};

void ExpectSame(const LatencyStats& a, const LatencyStats& b) {
  EXPECT_EQ(a.count(), b.count());
  EXPECT_EQ(a.sum(), b.sum());
  EXPECT_EQ(a.min(), b.min());
  EXPECT_EQ(a.max(), b.max());
  EXPECT_DOUBLE_EQ(a.mean(), b.mean());
  EXPECT_NEAR(a.RelStdErrPercent(), b.RelStdErrPercent(), 1e-6 * (1 + b.RelStdErrPercent()));
  EXPECT_NEAR(a.StdDev(), b.StdDev(), 1e-6 * (1 + b.StdDev()));
  for (double q : {0.0, 0.01, 0.25, 0.5, 0.9, 0.99, 0.999, 1.0}) {
    EXPECT_EQ(a.Quantile(q), b.Quantile(q)) << q;
  }
  for (size_t i = 0; i < LatencyHistogram::kBuckets; ++i) {
    ASSERT_EQ(a.histogram().bucket_count(i), b.histogram().bucket_count(i)) << i;
  }
}

TEST(BpfKvmHist, MergedRawCountsEqualAddingEveryValue) {
  std::mt19937_64 rng(7);
  std::lognormal_distribution<double> exit_ns(9.0, 1.5);  // ~8 us median, long tail
  LatencyStats added;
  Raw raw;
  for (int i = 0; i < 200000; ++i) {
    const auto d = static_cast<uint64_t>(exit_ns(rng));
    added.Add(d);
    raw.Add(d);
  }
  raw.Add(3'000'000'000);  // one 3 s exit: its square needs more than 64 bits summed
  added.Add(3'000'000'000);
  LatencyStats merged;
  merged.MergeBuckets(raw.Pairs(), raw.sum, raw.min, raw.max, raw.sum_sq);
  ExpectSame(merged, added);
}

TEST(BpfKvmHist, MergingIntoRowsThatHaveSamplesCombinesBoth) {
  LatencyStats a_then_b, merged;
  Raw raw;
  for (uint64_t d : {500, 700, 900, 25'000, 31'000}) {
    a_then_b.Add(d);
    merged.Add(d);
  }
  for (uint64_t d : {1, 127, 128, 4096, 1'000'000, 77}) {
    a_then_b.Add(d);
    raw.Add(d);
  }
  merged.MergeBuckets(raw.Pairs(), raw.sum, raw.min, raw.max, raw.sum_sq);
  ExpectSame(merged, a_then_b);
}

TEST(BpfKvmHist, EmptyAndOutOfRangeBucketsChangeNothing) {
  LatencyStats s;
  s.Add(1000);
  const LatencyStats before = s;
  s.MergeBuckets({}, 0, 0, 0, 0);
  std::vector<std::pair<uint32_t, uint64_t>> bad = {{KS_HIST_BUCKETS, 5}, {KS_HIST_BUCKETS + 9, 1}};
  s.MergeBuckets(bad, 123, 1, 2, 0);
  ExpectSame(s, before);
}

}  // namespace
}  // namespace exitscope::analysis
