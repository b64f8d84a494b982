// Pairing rules: kvm_exit -> kvm_entry with children, PVM userspace exits ended by kvm_fpu
// load (children BEFORE kvm_userspace_exit), read completions after re-entry, losses and
// unpaired records counted.
#include "sources/kvm_pairing.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace exitscope::sources {
namespace {

struct Captured {
  ExitEvent e;
  std::string reason, user_reason, device, reg;
};

struct Sink : EventSink {
  std::vector<Captured> exits;
  void OnExit(const ExitEvent& e) override {
    exits.push_back({e, std::string(e.reason), std::string(e.user_reason), std::string(e.device),
                     std::string(e.reg)});
  }
};

KvmRecord Rec(KvmEventType t, uint64_t ts, int32_t tid = 100) {
  KvmRecord r;
  r.type = t;
  r.ts = ts;
  r.tid = tid;
  return r;
}
KvmRecord Fpu(bool load, uint64_t ts, int32_t tid = 100) {
  KvmRecord r = Rec(KvmEventType::kFpu, ts, tid);
  r.write = load ? 1 : 0;
  return r;
}
KvmRecord Pio(bool write, uint16_t port, uint64_t ts, uint64_t val = 0, int32_t tid = 100) {
  KvmRecord r = Rec(KvmEventType::kPio, ts, tid);
  r.write = write;
  r.addr = port;
  r.size = 1;
  r.count = 1;
  r.data = val;
  return r;
}
KvmRecord Mmio(uint32_t type, uint64_t gpa, uint64_t ts, uint64_t val = 0, int32_t tid = 100) {
  KvmRecord r = Rec(KvmEventType::kMmio, ts, tid);
  r.mmio_type = type;
  r.addr = gpa;
  r.size = 4;
  r.data = val;
  r.write = type == kKvmMmioWrite;
  return r;
}
KvmRecord UserExit(uint32_t reason, uint64_t ts, int32_t tid = 100) {
  KvmRecord r = Rec(KvmEventType::kUserspaceExit, ts, tid);
  r.reason = reason;
  return r;
}
KvmRecord Exit(uint32_t reason, uint32_t isa, uint64_t ts, int64_t vcpu = 0, uint64_t info2 = 0,
               int32_t tid = 100) {
  KvmRecord r = Rec(KvmEventType::kExit, ts, tid);
  r.exit_reason = reason;
  r.isa = isa;
  r.vcpu_id = vcpu;
  r.info2 = info2;
  return r;
}
KvmRecord Entry(uint64_t ts, int64_t vcpu = 0, int32_t tid = 100) {
  KvmRecord r = Rec(KvmEventType::kEntry, ts, tid);
  r.vcpu_id = vcpu;
  return r;
}

TEST(KvmPairing, PvmUserspaceExitChildrenComeBeforeTheExitRecord) {
  Sink sink;
  KvmPairer p({}, &sink);
  // The order the capture shows per userspace exit.
  p.Feed(Fpu(true, 1000));
  KvmRecord insn = Rec(KvmEventType::kEmulateInsn, 1100);
  insn.guest_rip = 0x1000;
  p.Feed(insn);
  p.Feed(Pio(true, 0x3f8, 1200, 0x41));
  p.Feed(Fpu(false, 1300));
  p.Feed(UserExit(2, 1400));
  p.Feed(Fpu(true, 26400));  // next KVM_RUN: exit ends
  p.Feed(Mmio(kKvmMmioWrite, 0xd0000, 27000, 7));
  p.Feed(Fpu(false, 27100));
  p.Feed(UserExit(6, 27200));
  p.Feed(Fpu(true, 30200));
  p.Finish();
  ASSERT_EQ(sink.exits.size(), 2u);
  const Captured& io = sink.exits[0];
  EXPECT_EQ(io.reason, "IO");
  EXPECT_EQ(io.user_reason, "IO");
  EXPECT_TRUE(io.e.userspace);
  EXPECT_EQ(io.e.start_ns, 1400u);
  EXPECT_EQ(io.e.duration_ns, 25000u);
  EXPECT_EQ(io.e.subkey_kind, SubKeyKind::kPort);
  EXPECT_EQ(io.e.subkey, 0x3f8u);
  EXPECT_EQ(io.e.dir, AccessDir::kWrite);
  EXPECT_EQ(io.e.value, 0x41u);
  EXPECT_EQ(io.e.guest_rip, 0x1000u);
  EXPECT_EQ(io.e.vm, 100u);
  EXPECT_EQ(io.e.vcpu, 0u);
  const Captured& mmio = sink.exits[1];
  EXPECT_EQ(mmio.reason, "MMIO");
  EXPECT_EQ(mmio.e.subkey_kind, SubKeyKind::kMmio);
  EXPECT_EQ(mmio.e.subkey, 0xd0000u);
  EXPECT_EQ(mmio.e.dir, AccessDir::kWrite);
  EXPECT_EQ(mmio.e.duration_ns, 3000u);
  EXPECT_EQ(p.stats().userspace_exits, 2u);
  EXPECT_EQ(p.stats().unpaired_exits, 0u);
  EXPECT_EQ(p.stats().children_outside_exit, 0u);
}

TEST(KvmPairing, ReadCompletionAfterReentryAttachesToItsExit) {
  Sink sink;
  KvmPairer p({}, &sink);
  // PIO IN: no kvm_pio before the exit; KVM traces it when completing after re-entry.
  p.Feed(Fpu(true, 0));
  p.Feed(Rec(KvmEventType::kEmulateInsn, 10));
  p.Feed(Fpu(false, 20));
  p.Feed(UserExit(2, 30));
  p.Feed(Fpu(true, 530));
  p.Feed(Pio(false, 0x3fd, 540, 0x60));
  // MMIO read: unsatisfied-read before, read (with the value) after re-entry.
  p.Feed(Mmio(kKvmMmioUnsatisfiedRead, 0xfebf001c, 600));
  p.Feed(Fpu(false, 610));
  p.Feed(UserExit(6, 620));
  p.Feed(Fpu(true, 1620));
  p.Feed(Rec(KvmEventType::kEmulateInsn, 1630));
  p.Feed(Mmio(kKvmMmioRead, 0xfebf001c, 1640, 0x1));
  p.Finish();
  ASSERT_EQ(sink.exits.size(), 2u);
  EXPECT_EQ(sink.exits[0].e.subkey_kind, SubKeyKind::kPort);
  EXPECT_EQ(sink.exits[0].e.subkey, 0x3fdu);
  EXPECT_EQ(sink.exits[0].e.dir, AccessDir::kRead);
  EXPECT_EQ(sink.exits[0].e.value, 0x60u);
  EXPECT_EQ(sink.exits[0].e.duration_ns, 500u);
  EXPECT_EQ(sink.exits[1].e.subkey, 0xfebf001cu);
  EXPECT_EQ(sink.exits[1].e.dir, AccessDir::kRead);
  EXPECT_EQ(sink.exits[1].e.value, 0x1u);
  EXPECT_EQ(sink.exits[1].e.duration_ns, 1000u);
  EXPECT_EQ(p.stats().completions, 2u);
  // The emulate_insn after the second re-entry belongs to no exit.
  EXPECT_EQ(p.stats().children_outside_exit, 1u);
}

TEST(KvmPairing, KernelExitPairsWithNextEntryAndTakesChildren) {
  Sink sink;
  KvmPairer p({}, &sink);
  p.Feed(Entry(0, 2));          // first entry: no exit before it
  p.Feed(Exit(48, 1, 100, 2));  // EPT_VIOLATION
  p.Feed(Mmio(kKvmMmioWrite, 0xfebf1008, 150, 3));
  p.Feed(UserExit(6, 160));
  p.Feed(Fpu(true, 900));  // VMM re-enters: KVM_RUN, then kvm_entry ends the exit
  p.Feed(Entry(1000, 2));
  p.Feed(Exit(31 /* MSR_READ */, 1, 2000, 2));
  KvmRecord msr = Rec(KvmEventType::kMsr, 2010);
  msr.addr = 0xc0000080;
  msr.write = 0;
  p.Feed(msr);
  p.Feed(Entry(2500, 2));
  p.Feed(Exit(0x20000, 3, 3000, 2, 0x17088208));  // PVM HYPERCALL carrying HC_WRMSR
  p.Feed(Entry(3100, 2));
  p.Feed(Exit(12, 1, 4000, 2));  // never re-entered: open at end of trace
  p.Finish();
  ASSERT_EQ(sink.exits.size(), 4u);
  EXPECT_EQ(sink.exits[3].reason, "HLT");
  EXPECT_EQ(sink.exits[3].e.end, ExitEnd::kOpenAtEnd);
  EXPECT_EQ(sink.exits[3].e.start_ns, 4000u);
  EXPECT_EQ(p.stats().open_at_end, 1u);
  EXPECT_EQ(sink.exits[0].reason, "EPT_VIOLATION");
  EXPECT_TRUE(sink.exits[0].e.userspace);
  EXPECT_EQ(sink.exits[0].user_reason, "MMIO");
  EXPECT_EQ(sink.exits[0].e.duration_ns, 900u);
  EXPECT_EQ(sink.exits[0].e.subkey, 0xfebf1008u);
  EXPECT_EQ(sink.exits[0].e.vcpu, 2u);
  EXPECT_EQ(sink.exits[1].reason, "MSR_READ");
  EXPECT_EQ(sink.exits[1].e.subkey_kind, SubKeyKind::kMsr);
  EXPECT_EQ(sink.exits[1].e.subkey, 0xc0000080u);
  EXPECT_EQ(sink.exits[1].e.dir, AccessDir::kRead);
  EXPECT_FALSE(sink.exits[1].e.userspace);
  EXPECT_EQ(sink.exits[2].reason, "HC_WRMSR");
  EXPECT_EQ(sink.exits[2].e.isa, Isa::kPvm);
  EXPECT_EQ(sink.exits[2].e.subkey_kind, SubKeyKind::kHypercall);
  EXPECT_EQ(sink.exits[2].e.subkey, 0x17088208u);
  EXPECT_EQ(p.stats().kernel_exits, 3u);
  EXPECT_EQ(p.stats().entries_without_exit, 1u);
  EXPECT_EQ(p.stats().unpaired_exits, 1u);
}

TEST(KvmPairing, ThreadsPairIndependently) {
  Sink sink;
  KvmPairer p({}, &sink);
  p.SetThreadGroup(200, 199);
  p.SetThreadGroup(201, 199);
  p.Feed(Exit(12, 1, 100, 0, 0, 200));
  p.Feed(Exit(12, 1, 110, 1, 0, 201));
  p.Feed(Entry(300, 1, 201));
  p.Feed(Entry(500, 0, 200));
  p.Finish();
  ASSERT_EQ(sink.exits.size(), 2u);
  EXPECT_EQ(sink.exits[0].e.tid, 201u);
  EXPECT_EQ(sink.exits[0].e.duration_ns, 190u);
  EXPECT_EQ(sink.exits[0].e.vm, 199u);
  EXPECT_EQ(sink.exits[0].e.vcpu, 1u);
  EXPECT_EQ(sink.exits[1].e.tid, 200u);
  EXPECT_EQ(sink.exits[1].e.duration_ns, 400u);
}

TEST(KvmPairing, VcpuIndexFromThreadOrderWhenRecordsCarryNone) {
  Sink sink;
  KvmPairer p({}, &sink);
  p.SetThreadGroup(11, 10);
  p.SetThreadGroup(12, 10);
  for (int32_t tid : {12, 11}) {
    p.Feed(UserExit(5, 100, tid));
    p.Feed(Fpu(true, 200, tid));
  }
  p.Finish();
  ASSERT_EQ(sink.exits.size(), 2u);
  EXPECT_EQ(sink.exits[0].e.vcpu, 0u);  // thread 12 seen first
  EXPECT_EQ(sink.exits[1].e.vcpu, 1u);
  EXPECT_EQ(sink.exits[1].e.vm, 10u);
}

TEST(KvmPairing, LossDiscardsPendingStateOfThatCpuAndIsCounted) {
  Sink sink;
  KvmPairer p({}, &sink);
  KvmRecord e = Exit(12, 1, 100);
  e.cpu = 1;
  p.Feed(e);
  p.OnLost(1, 42);
  KvmRecord en = Entry(900);
  en.cpu = 1;
  p.Feed(en);  // its exit was discarded: this entry has nothing to end
  p.OnLost(0, -1);
  p.Finish();
  EXPECT_TRUE(sink.exits.empty());
  EXPECT_EQ(p.stats().lost_events, 42u);
  EXPECT_EQ(p.stats().lost_markers, 2u);
  EXPECT_EQ(p.stats().unpaired_exits, 1u);
  EXPECT_EQ(p.stats().entries_without_exit, 1u);
}

TEST(KvmPairing, ClockScaleConvertsTscCycles) {
  Sink sink;
  KvmPairer p({.clock = ClockScale::FromTscKhz(2'000'000)}, &sink);  // 2 GHz
  p.Feed(UserExit(5, 2000));
  p.Feed(Fpu(true, 52000));
  p.Finish();
  ASSERT_EQ(sink.exits.size(), 1u);
  EXPECT_EQ(sink.exits[0].e.start_ns, 1000u);
  EXPECT_EQ(sink.exits[0].e.duration_ns, 25000u);
}

TEST(KvmPairing, DeviceResolverNamesPortAndRegister) {
  struct Resolver : KvmDeviceResolver {
    bool Resolve(SubKeyKind kind, uint64_t addr, uint32_t, AccessDir, std::string_view* dev,
                 std::string_view* reg) const override {
      if (kind != SubKeyKind::kPort || addr < 0x3f8 || addr >= 0x400) return false;
      *dev = "com1";
      *reg = addr == 0x3f8 ? "THR" : "LSR";
      return true;
    }
  } resolver;
  Sink sink;
  KvmPairer p({.devices = &resolver}, &sink);
  p.Feed(Pio(true, 0x3f8, 10));
  p.Feed(UserExit(2, 20));
  p.Feed(Fpu(true, 30));
  p.Feed(Pio(true, 0x80, 40));
  p.Feed(UserExit(2, 50));
  p.Feed(Fpu(true, 60));
  p.Finish();
  ASSERT_EQ(sink.exits.size(), 2u);
  EXPECT_EQ(sink.exits[0].device, "com1");
  EXPECT_EQ(sink.exits[0].reg, "THR");
  EXPECT_EQ(sink.exits[1].device, "");
}

}  // namespace
}  // namespace exitscope::sources
