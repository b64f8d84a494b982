/* sources/bpf/kvm_stat_hist.h: the histogram bucket of a duration, in C for the BPF program;
 * the same function as base/histogram.h's LatencyHistogram::BucketOf (values below 128
 * exact, then 64 linear buckets per power of two), which tests/sources/bpf_kvm_hist_test.cc
 * checks value for value. No count-leading-zeros instruction in BPF: a binary search. */
#ifndef EXITSCOPE_SOURCES_BPF_KVM_STAT_HIST_H_
#define EXITSCOPE_SOURCES_BPF_KVM_STAT_HIST_H_

#include "kvm_stat_abi.h"

static inline __u32 ks_bucket_of(__u64 v) {
  if (v < (1ull << KS_HIST_SUB_BITS)) return (__u32)v;
  int msb = 0;
  __u64 x = v;
  if (x >> 32) {
    x >>= 32;
    msb += 32;
  }
  if (x >> 16) {
    x >>= 16;
    msb += 16;
  }
  if (x >> 8) {
    x >>= 8;
    msb += 8;
  }
  if (x >> 4) {
    x >>= 4;
    msb += 4;
  }
  if (x >> 2) {
    x >>= 2;
    msb += 2;
  }
  if (x >> 1) msb += 1;
  const int shift = msb - KS_HIST_SUB_BITS + 1; /* >= 1 */
  const __u64 half = 1ull << (KS_HIST_SUB_BITS - 1);
  const __u64 sub = v >> shift; /* in [half, 2 * half) */
  return (__u32)((1ull << KS_HIST_SUB_BITS) + (__u64)(shift - 1) * half + (sub - half));
}

#endif /* EXITSCOPE_SOURCES_BPF_KVM_STAT_HIST_H_ */
