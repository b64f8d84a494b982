// The owning exit and finding (KeptExit, KeptFinding) and the one slow-exit rule (SlowRule).
#include "analysis/kept_event.h"

#include <gtest/gtest.h>

#include <string>
#include <utility>
#include <vector>

namespace exitscope::analysis {
namespace {

// An event with every field set to something other than its default.
ExitEvent Full(std::string_view reason, std::string_view device, std::string_view reg,
               std::string_view user_reason) {
  ExitEvent e;
  e.start_ns = 11;
  e.duration_ns = 22;
  e.vcpu = 3;
  e.vm = 4242;
  e.isa = Isa::kSvm;
  e.reason = reason;
  e.subkey_kind = SubKeyKind::kMmio;
  e.subkey = 0xfebf1008;
  e.size = 4;
  e.dir = AccessDir::kWrite;
  e.userspace = true;
  e.device = device;
  e.reg = reg;
  e.device_offset = 0x1008;
  e.tid = 4243;
  e.guest_rip = 0xffffffff81000000;
  e.value = 0x55;
  e.user_reason = user_reason;
  e.failed_vmentry = true;
  e.end = ExitEnd::kOpenAtEnd;
  e.kernel_access = true;
  e.kind = ExitKind::kMmio;
  e.flags = kExitFlagSlow | kExitFlagStalled;
  return e;
}

void ExpectSame(const ExitEvent& a, const ExitEvent& b) {
  EXPECT_EQ(a.start_ns, b.start_ns);
  EXPECT_EQ(a.duration_ns, b.duration_ns);
  EXPECT_EQ(a.vcpu, b.vcpu);
  EXPECT_EQ(a.vm, b.vm);
  EXPECT_EQ(a.isa, b.isa);
  EXPECT_EQ(a.reason, b.reason);
  EXPECT_EQ(a.subkey_kind, b.subkey_kind);
  EXPECT_EQ(a.subkey, b.subkey);
  EXPECT_EQ(a.size, b.size);
  EXPECT_EQ(a.dir, b.dir);
  EXPECT_EQ(a.userspace, b.userspace);
  EXPECT_EQ(a.device, b.device);
  EXPECT_EQ(a.reg, b.reg);
  EXPECT_EQ(a.device_offset, b.device_offset);
  EXPECT_EQ(a.tid, b.tid);
  EXPECT_EQ(a.guest_rip, b.guest_rip);
  EXPECT_EQ(a.value, b.value);
  EXPECT_EQ(a.user_reason, b.user_reason);
  EXPECT_EQ(a.failed_vmentry, b.failed_vmentry);
  EXPECT_EQ(a.end, b.end);
  EXPECT_EQ(a.kernel_access, b.kernel_access);
  EXPECT_EQ(a.kind, b.kind);
  EXPECT_EQ(a.flags, b.flags);
}

TEST(KeptExit, OwnsItsStringsAndGivesTheEventBack) {
  std::vector<KeptExit> kept;
  {
    std::string reason = "EPT_MISCONFIG", device = "nvme0", reg = "SQ1TDBL", user = "MMIO";
    const ExitEvent e = Full(reason, device, reg, user);
    kept.emplace_back(e, "0xfebf1008:W");
    ExpectSame(kept.back().view(), e);
    reason.assign(reason.size(), 'x');  // the source's storage changes or goes away
    device.clear();
  }
  for (int i = 0; i < 100; ++i) kept.emplace_back(ExitEvent{});  // moves the first one
  const ExitEvent v = kept.front().view();
  EXPECT_EQ(v.reason, "EPT_MISCONFIG");
  EXPECT_EQ(v.device, "nvme0");
  EXPECT_EQ(v.reg, "SQ1TDBL");
  EXPECT_EQ(v.user_reason, "MMIO");
  EXPECT_EQ(kept.front().key, "0xfebf1008:W");
  EXPECT_TRUE(kept.front().open_at_end());
  EXPECT_TRUE(kept.front().stalled());
  // A view of a copy points into the copy.
  const KeptExit copy = kept.front();
  EXPECT_NE(copy.view().reason.data(), v.reason.data());
  ExpectSame(copy.view(), v);
}

TEST(KeptExit, DescribesADumpExit) {
  ExitEvent e = Full("MMIO", "nvme0", "SQ1TDBL", "");
  EXPECT_EQ(DescribeExit(KeptExit(e)), "exit MMIO write 4B to nvme0.SQ1TDBL (0xfebf1008)");
  e.kind = ExitKind::kHlt;
  EXPECT_EQ(DescribeExit(KeptExit(e)), "exit HLT");
}

TEST(KeptFinding, OwnsItsStringsAndGivesTheFindingBack) {
  std::string device = "nvme0", reg = "CC", text = "vCPU 0 stuck in exit for 25 ms";
  Finding f{.time_ns = 7,
            .type = FindingType::kStuckExitEnd,
            .vcpu = 2,
            .duration_ns = 25'000'000,
            .device = device,
            .reg = reg,
            .io_id = 9,
            .text = text};
  KeptFinding k(f);
  device.clear();
  text.clear();
  const Finding v = k.view();
  EXPECT_EQ(v.time_ns, 7u);
  EXPECT_EQ(v.type, FindingType::kStuckExitEnd);
  EXPECT_EQ(v.vcpu, 2u);
  EXPECT_EQ(v.duration_ns, 25'000'000u);
  EXPECT_EQ(v.device, "nvme0");
  EXPECT_EQ(v.reg, "CC");
  EXPECT_EQ(v.io_id, 9u);
  EXPECT_EQ(v.text, "vCPU 0 stuck in exit for 25 ms");
  EXPECT_TRUE(k.in_flight.empty());
}

TEST(SlowRule, ThresholdFlagsAndOnlyExitsWithAKnownTime) {
  ExitEvent e;
  e.duration_ns = 999;
  const SlowRule none;
  const SlowRule threshold{.threshold_ns = 1000};
  const SlowRule flags{.recorder_flags = true};
  EXPECT_FALSE(none.enabled());
  EXPECT_TRUE(threshold.enabled());
  EXPECT_TRUE(flags.enabled());
  EXPECT_FALSE(threshold.IsSlow(e));
  e.duration_ns = 1000;
  EXPECT_TRUE(threshold.IsSlow(e));  // at least the threshold
  EXPECT_FALSE(flags.IsSlow(e));
  EXPECT_FALSE(none.IsSlow(e));
  e.duration_ns = 1;
  e.flags = kExitFlagSlow;
  EXPECT_TRUE(flags.IsSlow(e));
  e.flags = kExitFlagStalled;
  EXPECT_TRUE(flags.IsSlow(e));
  e.flags = kExitFlagValue | kExitFlagNoEnd;
  EXPECT_FALSE(flags.IsSlow(e));
  // An exit open at end (or without an end record) is not slow, however long so far.
  e.flags = kExitFlagSlow;
  e.duration_ns = 1'000'000;
  for (ExitEnd end : {ExitEnd::kOpenAtEnd, ExitEnd::kNotTraced}) {
    e.end = end;
    EXPECT_FALSE(flags.IsSlow(e));
    EXPECT_FALSE(threshold.IsSlow(e));
  }
}

}  // namespace
}  // namespace exitscope::analysis
