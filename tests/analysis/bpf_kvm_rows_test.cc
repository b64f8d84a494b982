// analysis/bpf_kvm_rows: a snapshot of the program's maps becomes kvm report's rows with
// the keys, names, filters and groups KvmAggregator gives, and what the threads still hold is
// placed as KvmPairer::Finish() places it. The snapshots are built here field by field, in
// the maps' own layout (kvm_stat_abi.h); the end-to-end counts on real guests are
// bpf_kvm_stat_tracefs_test's.
#include <linux/types.h>

#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

#include "analysis/bpf_kvm_rows.h"
#include "gtest/gtest.h"

namespace exitscope::sources::bpf {
namespace {

using analysis::BpfKvmRowOptions;
using analysis::BpfKvmRows;
using analysis::BuildBpfKvmRows;
using analysis::ForEachBpfKvmExit;

using analysis::KvmEventClass;

ks_key UserExit(uint32_t tid, uint32_t reason, uint8_t kind, uint64_t sub, uint8_t dir) {
  ks_key k{};
  k.tgid = 100;
  k.tid = tid;
  k.vcpu = -1;
  k.flags = KS_F_USERSPACE;
  k.user_reason = reason;
  k.subkind = kind;
  k.subkey = sub;
  k.dir = dir;
  return k;
}

BpfKvmSample Sample(const ks_key& k, std::vector<uint64_t> durations, uint64_t untimed = 0) {
  BpfKvmSample s;
  s.key = k;
  s.stats.untimed = untimed;
  s.stats.min = ~0ull;
  for (uint64_t d : durations) {
    ++s.stats.timed;
    s.stats.sum += d;
    s.stats.min = std::min<uint64_t>(s.stats.min, d);
    s.stats.max = std::max<uint64_t>(s.stats.max, d);
    s.stats.sq_lo += d * d;
    bool found = false;
    for (auto& [b, n] : s.buckets)
      if (b == base::LatencyHistogram::BucketOf(d)) ++n, found = true;
    if (!found) s.buckets.emplace_back(base::LatencyHistogram::BucketOf(d), 1);
  }
  return s;
}

ks_thread Thread(uint32_t tid, uint64_t first_ts) {
  ks_thread t{};
  t.tgid = 100;
  t.tid = tid;
  t.vcpu = -1;
  t.first_ts = first_ts;
  return t;
}

const analysis::KvmRow* Row(const analysis::KvmGroup& g, const std::string& key) {
  for (const auto& r : g.rows)
    if (r->key == key) return r.get();
  return nullptr;
}

BpfKvmSnapshot Snapshot() {
  BpfKvmSnapshot s;
  s.samples.push_back(Sample(UserExit(7, 2, KS_SUB_PORT, 0x3f8, KS_DIR_WRITE), {7000, 9000}));
  s.samples.push_back(Sample(UserExit(7, 2, KS_SUB_PORT, 0x3fd, KS_DIR_READ), {6000}));
  s.samples.push_back(Sample(UserExit(8, 6, KS_SUB_MMIO, 0xfebf1008, KS_DIR_WRITE), {30000}));
  ks_key access{};
  access.tgid = 100;
  access.tid = 7;
  access.vcpu = -1;
  access.flags = KS_F_KERNEL_ACCESS | KS_F_NOT_TRACED;
  access.subkind = KS_SUB_PORT;
  access.subkey = 0x70;
  access.dir = KS_DIR_WRITE;
  s.samples.push_back(Sample(access, {}, 3));
  s.threads.push_back(Thread(7, 10));
  s.threads.push_back(Thread(8, 20));
  return s;
}

TEST(BpfKvmRows, UserspaceReasonsAndPortsAsKvmReportKeysThem) {
  BpfKvmRowOptions o;
  o.analysis.event = KvmEventClass::kUserspace;
  BpfKvmRows r = BuildBpfKvmRows(Snapshot(), o);
  const auto* io = Row(r.analysis.all, "IO");
  const auto* mmio = Row(r.analysis.all, "MMIO");
  ASSERT_NE(io, nullptr);
  ASSERT_NE(mmio, nullptr);
  EXPECT_EQ(io->samples(), 3u);
  EXPECT_EQ(io->stats.sum(), 22000u);
  EXPECT_EQ(io->stats.min(), 6000u);
  EXPECT_EQ(io->stats.max(), 9000u);
  EXPECT_EQ(mmio->samples(), 1u);
  EXPECT_EQ(r.analysis.all.rows.size(), 2u) << "kernel accesses are not exits";
  EXPECT_EQ(r.analysis.kernel_accesses_skipped, 3u);
  EXPECT_EQ(r.pairing.kernel_accesses, 3u);
  EXPECT_EQ(r.pairing.userspace_exits, 4u);

  o.analysis.event = KvmEventClass::kIoport;
  r = BuildBpfKvmRows(Snapshot(), o);
  const auto* thr = Row(r.analysis.all, "0x3f8:POUT");
  const auto* lsr = Row(r.analysis.all, "0x3fd:PIN");
  const auto* rtc = Row(r.analysis.all, "0x70:POUT");
  ASSERT_NE(thr, nullptr);
  ASSERT_NE(lsr, nullptr);
  ASSERT_NE(rtc, nullptr);
  EXPECT_EQ(thr->to_vmm(), 2u);
  EXPECT_EQ(lsr->to_vmm(), 1u);
  EXPECT_EQ(rtc->in_kernel, 3u);
  EXPECT_EQ(rtc->untimed, 3u);
  EXPECT_EQ(rtc->to_vmm(), 0u);
}

TEST(BpfKvmRows, FiltersAndVcpuNumbersFollowTheAggregator) {
  BpfKvmRowOptions o;
  o.analysis.event = KvmEventClass::kUserspace;
  o.analysis.per_vcpu = true;
  o.analysis.vcpu = 1;  // thread 8 was seen second: vCPU 1
  BpfKvmRows r = BuildBpfKvmRows(Snapshot(), o);
  ASSERT_EQ(r.analysis.all.rows.size(), 1u);
  EXPECT_EQ(r.analysis.all.rows[0]->key, "MMIO");
  EXPECT_EQ(r.analysis.exits_filtered, 3u);
  ASSERT_EQ(r.analysis.per_vcpu.size(), 1u);
  EXPECT_EQ(r.analysis.per_vcpu[0]->vcpu, 1);
}

TEST(BpfKvmRows, HeldAndInFlightExitsArePlacedAsThePairerFinishes) {
  BpfKvmSnapshot s = Snapshot();
  // Thread 7: a read exit that ended and waits for its completion (port unknown yet).
  s.threads[0].held = KS_HOLD_PIO_READ;
  s.threads[0].held_ev = UserExit(7, 2, KS_SUB_NONE, 0, KS_DIR_READ);
  s.threads[0].held_dur = 5000;
  // Thread 8: inside an MMIO exit since t=1000 (a stuck vCPU).
  s.threads[1].phase = KS_USER_EXIT;
  s.threads[1].exit_ts = 1000;
  s.threads[1].ev = UserExit(8, 6, KS_SUB_MMIO, 0xfebf1008, KS_DIR_WRITE);
  s.now_ns = 2'001'000;
  BpfKvmRowOptions o;
  o.analysis.event = KvmEventClass::kUserspace;
  BpfKvmRows live = BuildBpfKvmRows(s, o);
  EXPECT_EQ(Row(live.analysis.all, "IO")->samples(), 4u) << "the held exit is timed";
  ASSERT_EQ(live.in_flight.size(), 1u);
  EXPECT_EQ(live.in_flight[0].inside_ns, 2'000'000u);
  EXPECT_EQ(live.in_flight[0].exit.vcpu, 1u);
  EXPECT_EQ(live.analysis.open_at_end, 0u) << "not at the end yet";

  o.final = true;
  BpfKvmRows end = BuildBpfKvmRows(s, o);
  EXPECT_EQ(end.analysis.open_at_end, 1u);
  ASSERT_EQ(end.analysis.open_exits.size(), 1u);
  EXPECT_EQ(end.analysis.open_exits[0].reason, "MMIO");
  EXPECT_EQ(end.analysis.open_exits[0].start_ns, 1000u);
  EXPECT_EQ(end.pairing.open_at_end, 1u);
  EXPECT_EQ(Row(end.analysis.all, "MMIO")->samples(), 1u) << "open exits are in no row";

  // kvm-run pairing, between the kvm_fpu unload and kvm_userspace_exit (exit_ts not set): no
  // exit the VMM could see has started; not in flight, not open at the end.
  s.threads[1].exit_ts = 0;
  EXPECT_TRUE(BuildBpfKvmRows(s, o).in_flight.empty());
  EXPECT_EQ(BuildBpfKvmRows(s, o).analysis.open_at_end, 0u);
}

}  // namespace
}  // namespace exitscope::sources::bpf

namespace exitscope::sources::bpf {
namespace {

using analysis::BpfKvmRowOptions;
using analysis::BpfKvmRows;
using analysis::BuildBpfKvmRows;

ks_key Access(uint32_t tid, int32_t vcpu, uint8_t kind, uint64_t sub, uint8_t dir, uint8_t size) {
  ks_key k{};
  k.tgid = 100;
  k.tid = tid;
  k.vcpu = vcpu;
  k.flags = KS_F_KERNEL_ACCESS | KS_F_NOT_TRACED;
  k.subkind = kind;
  k.subkey = sub;
  k.dir = dir;
  k.size = size;
  return k;
}

uint64_t Untimed(const BpfKvmSnapshot& s, const ks_key& k) {
  for (const BpfKvmSample& x : s.samples)
    if (std::memcmp(&x.key, &k, sizeof k) == 0) return x.stats.untimed;
  return ~0ull;  // not there
}

// The kvm-run pairing counts every access hit as handled in the kernel; each userspace exit's
// own hit comes out again: ended exits (timed or not) and exits in flight whose hit came
// before them (a write, a hypercall), on the same thread, port/address, direction and size,
// whichever vCPU number the access was counted under. Reads in flight (their hit comes with
// the completion), MSR exits (no hit) and other threads' accesses stay.
TEST(BpfKvmRows, KvmRunPairingSubtractsEachExitsOwnAccess) {
  BpfKvmSnapshot s;
  ks_key out = UserExit(7, 2, KS_SUB_PORT, 0x3f8, KS_DIR_WRITE);
  out.size = 1;
  s.samples.push_back(Sample(out, {7000, 9000, 8000}, 1));  // 4 exits
  ks_key in = UserExit(7, 2, KS_SUB_PORT, 0x3fd, KS_DIR_READ);
  in.size = 1;
  s.samples.push_back(Sample(in, {6000}));  // 1 exit
  ks_key msr = UserExit(7, 29, KS_SUB_MSR, 0x10, KS_DIR_READ);
  msr.size = 8;
  s.samples.push_back(Sample(msr, {5000}));
  const ks_key out_vcpu0 = Access(7, 0, KS_SUB_PORT, 0x3f8, KS_DIR_WRITE, 1);
  const ks_key out_unnumbered = Access(7, -1, KS_SUB_PORT, 0x3f8, KS_DIR_WRITE, 1);
  const ks_key in_acc = Access(7, 0, KS_SUB_PORT, 0x3fd, KS_DIR_READ, 1);
  const ks_key msr_acc = Access(7, 0, KS_SUB_MSR, 0x10, KS_DIR_READ, 8);
  const ks_key other_thread = Access(8, 1, KS_SUB_PORT, 0x3f8, KS_DIR_WRITE, 1);
  const ks_key other_size = Access(7, 0, KS_SUB_PORT, 0x3f8, KS_DIR_WRITE, 2);
  s.samples.push_back(Sample(out_unnumbered, {}, 1));  // the first, before the vCPU was known
  s.samples.push_back(Sample(out_vcpu0, {}, 9));
  s.samples.push_back(Sample(in_acc, {}, 1));
  s.samples.push_back(Sample(msr_acc, {}, 2));
  s.samples.push_back(Sample(other_thread, {}, 3));
  s.samples.push_back(Sample(other_size, {}, 4));
  ks_thread t = Thread(7, 10);
  t.phase = KS_USER_EXIT;  // a write in flight: its hit is in
  t.exit_ts = 5;
  t.ev = out;
  s.threads.push_back(t);
  ks_thread r = Thread(9, 10);
  r.phase = KS_USER_EXIT;  // a read in flight: its hit comes later
  r.exit_ts = 5;
  r.ev = UserExit(9, 2, KS_SUB_PORT, 0x60, KS_DIR_READ);
  r.ev.size = 1;
  s.threads.push_back(r);
  s.samples.push_back(Sample(Access(9, 2, KS_SUB_PORT, 0x60, KS_DIR_READ, 1), {}, 2));

  SubtractOwnAccesses(&s);
  // 10 hits of 0x3f8 writes on thread 7 (1 + 9), 4 ended exits + 1 in flight: 5 in the kernel.
  EXPECT_EQ(Untimed(s, out_unnumbered), ~0ull) << "taken first, to 0: the row is gone";
  EXPECT_EQ(Untimed(s, out_vcpu0), 5u);
  EXPECT_EQ(Untimed(s, in_acc), ~0ull) << "1 hit, 1 exit: the row is gone";
  EXPECT_EQ(Untimed(s, msr_acc), 2u);
  EXPECT_EQ(Untimed(s, other_thread), 3u);
  EXPECT_EQ(Untimed(s, other_size), 4u);
  EXPECT_EQ(Untimed(s, Access(9, 2, KS_SUB_PORT, 0x60, KS_DIR_READ, 1)), 2u);
  EXPECT_EQ(Untimed(s, out), 1u) << "the exits themselves are untouched";
}

}  // namespace
}  // namespace exitscope::sources::bpf
