// Checks the histogram's layout at compile time (the bucket edges are shared with the BPF
// program: sources/bpf/kvm_stat_hist.h).
#include "base/histogram.h"

namespace exitscope::base {
using H = LatencyHistogram;
static_assert(H::BucketOf(127) == 127 && H::BucketOf(128) == 128);
static_assert(H::BucketLow(H::BucketOf(1'000'000)) <= 1'000'000);
static_assert(H::BucketHigh(H::BucketOf(1'000'000)) >= 1'000'000);
static_assert(H::BucketOf(~uint64_t{0}) == H::kBuckets - 1);
}  // namespace exitscope::base
