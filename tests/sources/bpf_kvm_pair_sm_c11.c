/* tests/sources/bpf_kvm_pair_sm_c11.c: kvm_pair_sm.h compiled as ISO C11 (-std=c11
 * -pedantic-errors), the language the BPF program is written in, for
 * bpf_kvm_pair_sm_test.cc, which feeds this copy and its own C++ one the same records and
 * checks that they count the same. The two hooks go to the test's maps. */
#include <linux/types.h>

#include "sources/bpf/kvm_stat_abi.h"

struct ks_counters* ks_c11_counters(void);
void ks_c11_add_sample(struct ks_thread* t, const struct ks_key* k, __u64 d, int timed);

static struct ks_counters* ks_sm_counters(void) {
  return ks_c11_counters();
}

static void ks_sm_add_sample(struct ks_thread* t, const struct ks_key* k, __u64 d, int timed) {
  ks_c11_add_sample(t, k, d, timed);
}

#include "sources/bpf/kvm_pair_sm.h"

int ks_c11_record(struct ks_thread* t, const struct ks_rec* r, __u32 tid);

/* One record through the C11 copy of the tracepoint pairing (ks_sm_record). */
int ks_c11_record(struct ks_thread* t, const struct ks_rec* r, __u32 tid) {
  return ks_sm_record(t, r, tid);
}
