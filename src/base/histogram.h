// base/histogram.h: fixed-memory latency distribution and running statistics.
//
// LatencyHistogram is a log-linear histogram over uint64 nanoseconds (HdrHistogram-like):
// values below 128 are counted exactly; above, each power of two is split into 64 linear
// buckets, so a bucket spans at most 1/64 of its lower bound. A percentile is reported as the
// midpoint of its bucket, clamped to the observed min and max: relative error <= 0.78% (1/128).
// Memory is fixed (3776 counters, ~30 KiB) whatever the number of samples; Add() is O(1) with
// no allocation, Merge() adds two histograms.
//
// LatencyStats adds count, sum, min, max and Welford's running variance, so the standard
// error of the mean can be printed exactly as `perf kvm stat` does ("+-" column).
#pragma once

#include <algorithm>
#include <array>
#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <span>
#include <utility>

namespace exitscope::base {

class LatencyHistogram {
 public:
  static constexpr int kSubBits = 7;  // 128 exact values, then 64 per octave
  static constexpr uint64_t kLinear = uint64_t{1} << kSubBits;
  static constexpr uint64_t kHalf = kLinear / 2;
  static constexpr size_t kBuckets = kLinear + (64 - kSubBits) * kHalf;
  static constexpr double kMaxRelativeError = 1.0 / (2.0 * kHalf);  // midpoint error bound

  static constexpr size_t BucketOf(uint64_t v) noexcept {
    if (v < kLinear) return static_cast<size_t>(v);
    const int msb = 63 - std::countl_zero(v);  // >= kSubBits
    const int shift = msb - kSubBits + 1;      // >= 1
    const uint64_t sub = v >> shift;           // in [kHalf, kLinear)
    return static_cast<size_t>(kLinear + static_cast<uint64_t>(shift - 1) * kHalf + (sub - kHalf));
  }
  // Smallest value in bucket b.
  static constexpr uint64_t BucketLow(size_t b) noexcept {
    if (b < kLinear) return b;
    const uint64_t shift = (b - kLinear) / kHalf + 1;
    const uint64_t sub = (b - kLinear) % kHalf + kHalf;
    return sub << shift;
  }
  // Largest value in bucket b.
  static constexpr uint64_t BucketHigh(size_t b) noexcept {
    if (b < kLinear) return b;
    const uint64_t shift = (b - kLinear) / kHalf + 1;
    return BucketLow(b) + ((uint64_t{1} << shift) - 1);
  }

  void Add(uint64_t v, uint64_t n = 1) noexcept {
    counts_[BucketOf(v)] += n;
    total_ += n;
    min_ = std::min(min_, v);
    max_ = std::max(max_, v);
  }
  void Merge(const LatencyHistogram& o) noexcept {
    for (size_t i = 0; i < kBuckets; ++i) counts_[i] += o.counts_[i];
    total_ += o.total_;
    min_ = std::min(min_, o.min_);
    max_ = std::max(max_, o.max_);
  }

  // Adds counts kept elsewhere in these same buckets (an eBPF map of `kvm stat --bpf`):
  // (bucket index, count) pairs, and the min and max of the values counted. Indices at or
  // past kBuckets are ignored.
  void MergeBuckets(std::span<const std::pair<uint32_t, uint64_t>> buckets, uint64_t min,
                    uint64_t max) noexcept {
    uint64_t n = 0;
    for (const auto& [b, c] : buckets) {
      if (b >= kBuckets || c == 0) continue;
      counts_[b] += c;
      n += c;
    }
    if (n == 0) return;
    total_ += n;
    min_ = std::min(min_, min);
    max_ = std::max(max_, max);
  }

  uint64_t count() const noexcept { return total_; }
  uint64_t min() const noexcept { return total_ ? min_ : 0; }
  uint64_t max() const noexcept { return max_; }
  uint64_t bucket_count(size_t b) const noexcept { return counts_[b]; }

  // Value at quantile q in [0, 1] (0.99 for p99); 0 when empty.
  uint64_t Quantile(double q) const noexcept {
    if (total_ == 0) return 0;
    q = std::clamp(q, 0.0, 1.0);
    // Rank of the sample, 1-based: ceil(q * n), at least 1.
    uint64_t rank = static_cast<uint64_t>(std::ceil(q * static_cast<double>(total_)));
    rank = std::clamp<uint64_t>(rank, 1, total_);
    uint64_t seen = 0;
    for (size_t b = 0; b < kBuckets; ++b) {
      seen += counts_[b];
      if (seen >= rank) {
        const uint64_t lo = BucketLow(b), hi = BucketHigh(b);
        return std::clamp(lo + (hi - lo) / 2, min(), max_);
      }
    }
    return max_;
  }

 private:
  std::array<uint64_t, kBuckets> counts_{};
  uint64_t total_ = 0;
  uint64_t min_ = std::numeric_limits<uint64_t>::max();
  uint64_t max_ = 0;
};

class LatencyStats {
 public:
  void Add(uint64_t ns) noexcept {
    hist_.Add(ns);
    sum_ += ns;
    const double x = static_cast<double>(ns);
    const double n = static_cast<double>(hist_.count());
    const double delta = x - mean_;
    mean_ += delta / n;
    m2_ += delta * (x - mean_);
  }
  void Merge(const LatencyStats& o) noexcept {
    if (o.count() == 0) return;
    const double na = static_cast<double>(count()), nb = static_cast<double>(o.count());
    const double delta = o.mean_ - mean_;
    const double n = na + nb;
    m2_ += o.m2_ + delta * delta * na * nb / n;
    mean_ += delta * nb / n;
    sum_ += o.sum_;
    hist_.Merge(o.hist_);
  }

  // Merges a distribution kept elsewhere in LatencyHistogram's buckets (the eBPF maps of
  // `kvm stat --bpf`): its (bucket, count) pairs, the sum, min and max of its values and the
  // sum of their squares. Equal to Add()ing each value, up to rounding in the variance.
  void MergeBuckets(std::span<const std::pair<uint32_t, uint64_t>> buckets, uint64_t sum,
                    uint64_t min, uint64_t max, long double sum_squares) noexcept {
    LatencyStats o;
    o.hist_.MergeBuckets(buckets, min, max);
    const uint64_t n = o.count();
    if (n == 0) return;
    o.sum_ = sum;
    const long double mean = static_cast<long double>(sum) / static_cast<long double>(n);
    o.mean_ = static_cast<double>(mean);
    o.m2_ = static_cast<double>(
        std::max<long double>(0.0L, sum_squares - mean * static_cast<long double>(sum)));
    Merge(o);
  }

  uint64_t count() const noexcept { return hist_.count(); }
  uint64_t sum() const noexcept { return sum_; }
  uint64_t min() const noexcept { return hist_.min(); }
  uint64_t max() const noexcept { return hist_.max(); }
  double mean() const noexcept { return count() ? static_cast<double>(sum_) / count() : 0.0; }
  // Standard error of the mean relative to the mean, in percent: perf kvm stat's "( +- x% )".
  double RelStdErrPercent() const noexcept {
    const uint64_t n = count();
    if (n < 2 || mean_ == 0.0) return 0.0;
    const double var = m2_ / static_cast<double>(n - 1);
    return 100.0 * std::sqrt(var / static_cast<double>(n)) / mean_;
  }
  double StdDev() const noexcept {
    const uint64_t n = count();
    return n < 2 ? 0.0 : std::sqrt(m2_ / static_cast<double>(n - 1));
  }
  uint64_t Quantile(double q) const noexcept { return hist_.Quantile(q); }
  const LatencyHistogram& histogram() const noexcept { return hist_; }

 private:
  LatencyHistogram hist_;
  uint64_t sum_ = 0;
  double mean_ = 0.0;
  double m2_ = 0.0;
};

}  // namespace exitscope::base
