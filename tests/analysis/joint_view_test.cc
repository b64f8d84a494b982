// The joint view: the kernel's and the VMM's view of the same exit (analysis/joint_view.h),
// on the real joint-blk capture and on constructed cases.
#include "analysis/joint_view.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <set>
#include <string>
#include <vector>

#include "exitscope/dump.h"

namespace exitscope::analysis {
namespace {

std::string KvmHost(const char* name) {
  return std::string(EXITSCOPE_TESTDATA_DIR) + "/kvm-host/" + name;
}

const std::set<std::string>& KnownReasons() {
  static const std::set<std::string> r = {
      kReasonOpenAtEnd,      kReasonInProgress,  kReasonBeforeDump,   kReasonAfterDump,
      kReasonBeforeTrace,    kReasonAfterTrace,  kReasonNoKernelExit, kReasonNoVmmExit,
      kReasonUnmappedThread, kReasonUnmappedVcpu};
  return r;
}

TEST(JointViewBlk, MatchesAndSplitsEveryExitOfTheRealCapture) {
  const std::string dump_path = KvmHost("joint-blk.esdump");
  auto dump = ReadDump(dump_path);
  ASSERT_TRUE(dump.has_value()) << dump.error().message;
  auto v = BuildJointViewFromTrace(*dump, dump_path, KvmHost("joint-blk.dat"));
  ASSERT_TRUE(v.has_value()) << v.error().message;

  EXPECT_EQ(v->vmm_exits, 1444u);
  EXPECT_GE(v->matched.size(), 1440u);
  EXPECT_EQ(v->matched.size() + v->unmatched_vmm.size(), v->vmm_exits);
  EXPECT_EQ(v->matched.size() + v->unmatched_kernel.size(), v->kernel_exits);
  EXPECT_EQ(v->mapping, JointMapping::kThreadByTime);
  ASSERT_EQ(v->threads.size(), dump->vcpus.size());
  EXPECT_NE(v->threads.front().tid, v->threads.back().tid);
  EXPECT_EQ(v->tsc_hz, dump->clock.tsc_hz);
  for (const JointUnmatched& u : v->unmatched_vmm) {
    EXPECT_TRUE(KnownReasons().count(u.reason)) << u.reason;
    EXPECT_NE(u.reason, kReasonNoKernelExit) << u.what;
  }
  for (const JointUnmatched& u : v->unmatched_kernel) {
    EXPECT_TRUE(KnownReasons().count(u.reason)) << u.reason;
    EXPECT_NE(u.reason, kReasonNoVmmExit) << u.what;
  }
  size_t sane = 0;
  for (const JointExit& j : v->matched) {
    ASSERT_EQ(j.before_ns + j.handler_ns + j.after_ns, j.kernel_ns);
    EXPECT_GE(j.offset_ns, -2);
    const uint64_t kernel_part = j.before_ns + j.after_ns;
    if (kernel_part >= 1'000 && kernel_part <= 1'000'000) ++sane;
  }
  // The kernel's part of a round trip on this host is ~20 us: between 1 us and 1 ms for
  // (nearly) every exit. A bound, not a timing.
  EXPECT_GE(sane, v->matched.size() * 99 / 100);
  EXPECT_GE(v->offset.median_ns, 1'000);
  EXPECT_LE(v->offset.median_ns, 1'000'000);

  const JointGroups g = GroupJointExits(v->matched);
  uint64_t n = 0;
  for (const JointGroup& k : g.by_kind) n += k.count;
  EXPECT_EQ(n, v->matched.size());
  bool doorbell = false;
  for (const JointGroup& r : g.by_register) doorbell |= r.key.find("DBL") != std::string::npos;
  EXPECT_TRUE(doorbell);
  std::printf(
      "joint-blk: %zu matched, %zu VMM and %zu kernel unmatched, offset median %lld ns "
      "max %lld ns\n",
      v->matched.size(), v->unmatched_vmm.size(), v->unmatched_kernel.size(),
      static_cast<long long>(v->offset.median_ns), static_cast<long long>(v->offset.max_ns));
}

// A dump of version 4 names each vCPU's thread (DumpVcpu::tid): the view takes it as it is,
// where the trace has that thread's exits, instead of voting by time. joint-blk's dump is
// version 1, so the ids are given here: the ones the vote found, then wrong ones.
TEST(JointViewBlk, TheDumpsThreadIdsTieEachVcpuToItsThread) {
  const std::string dump_path = KvmHost("joint-blk.esdump");
  auto dump = ReadDump(dump_path);
  ASSERT_TRUE(dump.has_value()) << dump.error().message;
  auto by_time = BuildJointViewFromTrace(*dump, dump_path, KvmHost("joint-blk.dat"));
  ASSERT_TRUE(by_time.has_value()) << by_time.error().message;
  ASSERT_EQ(by_time->threads.size(), 2u);
  const uint32_t tid0 = by_time->threads[0].tid, tid1 = by_time->threads[1].tid;

  Dump with_ids = *dump;
  with_ids.vcpus[0].tid = static_cast<int32_t>(tid0);
  with_ids.vcpus[1].tid = static_cast<int32_t>(tid1);
  auto by_id = BuildJointViewFromTrace(with_ids, dump_path, KvmHost("joint-blk.dat"));
  ASSERT_TRUE(by_id.has_value()) << by_id.error().message;
  EXPECT_EQ(by_id->mapping, JointMapping::kThreadId);
  ASSERT_EQ(by_id->threads.size(), 2u);
  EXPECT_EQ(by_id->threads[0].tid, tid0);
  EXPECT_EQ(by_id->threads[1].tid, tid1);
  EXPECT_EQ(by_id->threads[0].votes, 0u);  // not voted: given
  EXPECT_EQ(by_id->matched.size(), by_time->matched.size());

  // A thread the trace does not have: that vCPU is voted for, the other keeps its id.
  with_ids.vcpus[0].tid = 999999;
  auto mixed = BuildJointViewFromTrace(with_ids, dump_path, KvmHost("joint-blk.dat"));
  ASSERT_TRUE(mixed.has_value()) << mixed.error().message;
  EXPECT_EQ(mixed->mapping, JointMapping::kThreadId);
  EXPECT_EQ(mixed->threads[0].tid, tid0);
  EXPECT_GT(mixed->threads[0].votes, 0u);
  EXPECT_EQ(mixed->matched.size(), by_time->matched.size());

  // Ids swapped: taken as given (not voted over), so few exits nest and the view is refused
  // with what it found.
  with_ids.vcpus[0].tid = static_cast<int32_t>(tid1);
  with_ids.vcpus[1].tid = static_cast<int32_t>(tid0);
  auto swapped = BuildJointViewFromTrace(with_ids, dump_path, KvmHost("joint-blk.dat"));
  ASSERT_FALSE(swapped.has_value());
  EXPECT_NE(swapped.error().message.find("lie inside a kernel exit of their vCPU thread"),
            std::string::npos)
      << swapped.error().message;
}

// joint-sched: a real run recorded with sched:sched_switch on a loaded host. Every matched
// exit's four parts sum to the kernel's duration, the thread was switched out inside some
// exits, and the off-CPU time never exceeds an exit.
TEST(JointViewSched, RealCaptureSplitsOffCpuTimeOut) {
  const std::string dump_path = KvmHost("joint-sched.esdump");
  auto dump = ReadDump(dump_path);
  ASSERT_TRUE(dump.has_value()) << dump.error().message;
  auto v = BuildJointViewFromTrace(*dump, dump_path, KvmHost("joint-sched.dat"));
  ASSERT_TRUE(v.has_value()) << v.error().message;
  EXPECT_TRUE(v->sched_recorded);
  EXPECT_EQ(v->sched_switches, 3763u);
  EXPECT_EQ(v->vmm_exits, 838u);
  EXPECT_GE(v->matched.size(), 830u);
  EXPECT_EQ(v->matched.size() + v->unmatched_vmm.size(), v->vmm_exits);
  size_t switched_out = 0;
  uint64_t off = 0, runnable = 0;
  for (const JointExit& j : v->matched) {
    ASSERT_EQ(j.before_ns + j.handler_ns + j.after_ns + j.off_cpu_ns, j.kernel_ns);
    ASSERT_LE(j.off_cpu_runnable_ns, j.off_cpu_ns);
    ASSERT_LE(j.handler_ns, j.handler_wall_ns);
    if (j.off_cpu_ns > 0) ++switched_out;
    off += j.off_cpu_ns;
    runnable += j.off_cpu_runnable_ns;
  }
  EXPECT_GT(switched_out, 0u);
  std::printf(
      "joint-sched: %zu matched, %zu switched out inside an exit, off-CPU %.3f ms (%.3f ms "
      "preempted)\n",
      v->matched.size(), switched_out, static_cast<double>(off) / 1e6,
      static_cast<double>(runnable) / 1e6);
}

// Constructed cases: a dump whose TSC is 1 GHz with base 0, so a tick is a nanosecond on
// both sides, and one kernel userspace exit per VMM exit: the kernel exit starts 5 us before
// the handler and ends 7 us after it.
constexpr uint64_t kPeriod = 100'000, kBefore = 5'000, kHandler = 10'000, kAfter = 7'000;

struct Case {
  Dump dump;
  std::vector<ExitEvent> kernel;
};

Case MakeCase(int n, int64_t shift_ticks = 0) {
  Case c;
  c.dump.clock.source = ClockSource::kTsc;
  c.dump.clock.tsc_hz = 1'000'000'000;
  c.dump.clock.ns_per_tick = 1.0;
  c.dump.clock.base_ticks = 0;
  c.dump.clock.base_ns = 0;
  DeviceInfo dev;
  dev.name = "uart0";
  c.dump.devices.push_back(dev);
  c.dump.vcpus.resize(1);
  for (int i = 0; i < n; ++i) {
    const uint64_t t = 1'000'000 + static_cast<uint64_t>(i) * kPeriod;
    DumpExit d;
    d.start_ns = t + kBefore;
    d.duration_ns = kHandler;
    d.kind = ExitKind::kPio;
    d.addr = 0x3f8;
    d.device = 0;
    d.dir = AccessDir::kWrite;
    c.dump.vcpus[0].exits.push_back(d);
    ExitEvent e;
    e.start_ns = static_cast<uint64_t>(static_cast<int64_t>(t) + shift_ticks);
    e.duration_ns = kBefore + kHandler + kAfter;
    e.tid = 4242;
    e.userspace = true;
    e.reason = "IO";
    e.user_reason = "IO";
    c.kernel.push_back(e);
  }
  return c;
}

TEST(JointView, SplitsEachExitIntoItsThreeParts) {
  Case c = MakeCase(10);
  auto v = BuildJointView(c.dump, c.kernel, "x86-tsc");
  ASSERT_TRUE(v.has_value()) << v.error().message;
  ASSERT_EQ(v->matched.size(), 10u);
  EXPECT_TRUE(v->unmatched_vmm.empty());
  EXPECT_TRUE(v->unmatched_kernel.empty());
  for (const JointExit& j : v->matched) {
    EXPECT_EQ(j.before_ns, kBefore);
    EXPECT_EQ(j.handler_ns, kHandler);
    EXPECT_EQ(j.after_ns, kAfter);
    EXPECT_EQ(j.tid, 4242u);
    EXPECT_EQ(j.kind, "PIO");
    EXPECT_EQ(j.device, "uart0");
  }
  EXPECT_EQ(v->offset.median_ns, static_cast<int64_t>(kBefore));
  EXPECT_EQ(v->offset.max_ns, static_cast<int64_t>(kBefore));
  ASSERT_EQ(v->threads.size(), 1u);
  EXPECT_EQ(v->threads[0].tid, 4242u);
  const JointGroups g = GroupJointExits(v->matched);
  ASSERT_EQ(g.by_kind.size(), 1u);
  EXPECT_EQ(g.by_kind[0].handler.p50_ns, kHandler);
  EXPECT_NEAR(g.by_kind[0].handler.share_p50, 10.0 / 22.0, 1e-9);
}

TEST(JointView, AKernelExitDroppedLeavesItsVmmExitUnmatchedWithAReason) {
  Case c = MakeCase(10);
  c.kernel.erase(c.kernel.begin() + 4);
  auto v = BuildJointView(c.dump, c.kernel, "x86-tsc");
  ASSERT_TRUE(v.has_value()) << v.error().message;
  EXPECT_EQ(v->matched.size(), 9u);
  ASSERT_EQ(v->unmatched_vmm.size(), 1u);
  EXPECT_EQ(v->unmatched_vmm[0].reason, kReasonNoKernelExit);
  EXPECT_EQ(v->unmatched_vmm[0].start_ns, 1'000'000 + 4 * kPeriod + kBefore);
  EXPECT_TRUE(v->unmatched_kernel.empty());
}

TEST(JointView, AVmmExitDroppedLeavesItsKernelExitUnmatchedWithAReason) {
  Case c = MakeCase(10);
  c.dump.vcpus[0].exits.erase(c.dump.vcpus[0].exits.begin() + 4);
  auto v = BuildJointView(c.dump, c.kernel, "x86-tsc");
  ASSERT_TRUE(v.has_value()) << v.error().message;
  EXPECT_EQ(v->matched.size(), 9u);
  ASSERT_EQ(v->unmatched_kernel.size(), 1u);
  EXPECT_EQ(v->unmatched_kernel[0].reason, kReasonNoVmmExit);
  EXPECT_EQ(v->unmatched_kernel[0].tid, 4242u);
}

TEST(JointView, ASmallTscShiftStillNestsAndShowsInTheOffset) {
  // 3 us later on the kernel side: still inside the 5 us slack before the handler.
  Case c = MakeCase(10, 3'000);
  auto v = BuildJointView(c.dump, c.kernel, "x86-tsc");
  ASSERT_TRUE(v.has_value()) << v.error().message;
  EXPECT_EQ(v->matched.size(), 10u);
  EXPECT_EQ(v->offset.median_ns, 2'000);
  for (const JointExit& j : v->matched) {
    EXPECT_EQ(j.before_ns + j.handler_ns + j.after_ns, j.kernel_ns);
  }
}

TEST(JointView, ATscShiftBeyondTheKernelsSlackIsRefused) {
  // 8 us later: no VMM exit lies inside a kernel exit any more. The view refuses rather
  // than guessing an offset (docs/joint.md).
  Case c = MakeCase(10, 8'000);
  auto v = BuildJointView(c.dump, c.kernel, "x86-tsc");
  ASSERT_FALSE(v.has_value());
  EXPECT_EQ(v.error().code, ErrorCode::kInvalidArgument);
  EXPECT_NE(v.error().message.find("cannot be aligned"), std::string::npos) << v.error().message;
}

TEST(JointView, ClocksWithoutOverlapAreRefused) {
  Case c = MakeCase(10, 3'000'000'000);
  auto v = BuildJointView(c.dump, c.kernel, "x86-tsc");
  ASSERT_FALSE(v.has_value());
  EXPECT_NE(v.error().message.find("do not overlap"), std::string::npos) << v.error().message;
}

TEST(JointView, ATraceClockOtherThanX86TscIsRefused) {
  Case c = MakeCase(10);
  auto v = BuildJointView(c.dump, c.kernel, "local");
  ASSERT_FALSE(v.has_value());
  EXPECT_NE(v.error().message.find("'local', not x86-tsc"), std::string::npos) << v.error().message;
  c.dump.clock.source = ClockSource::kMonotonic;
  EXPECT_FALSE(BuildJointView(c.dump, c.kernel, "x86-tsc").has_value());
}

TEST(JointView, TraceCutShortLeavesLaterVmmExitsOutsideItsRange) {
  Case c = MakeCase(10);
  c.kernel.resize(6);
  // The 6th kernel exit never ended: open at end of trace.
  c.kernel[5].end = ExitEnd::kOpenAtEnd;
  c.kernel[5].duration_ns = 0;
  auto v = BuildJointView(c.dump, c.kernel, "x86-tsc");
  ASSERT_TRUE(v.has_value()) << v.error().message;
  EXPECT_EQ(v->matched.size(), 5u);
  ASSERT_EQ(v->unmatched_vmm.size(), 5u);
  EXPECT_EQ(v->unmatched_vmm[0].reason, kReasonOpenAtEnd);
  for (size_t i = 1; i < 5; ++i) EXPECT_EQ(v->unmatched_vmm[i].reason, kReasonAfterTrace);
  ASSERT_EQ(v->unmatched_kernel.size(), 1u);
  EXPECT_EQ(v->unmatched_kernel[0].reason, kReasonOpenAtEnd);
}

TEST(JointView, DumpCutShortLeavesEarlierKernelExitsBeforeItsOldestExit) {
  Case c = MakeCase(10);
  auto& exits = c.dump.vcpus[0].exits;
  exits.erase(exits.begin(), exits.begin() + 4);  // the ring overwrote the oldest four
  // and the VMM was inside the last one when the dump was taken.
  c.dump.vcpus[0].in_progress = exits.back();
  exits.pop_back();
  auto v = BuildJointView(c.dump, c.kernel, "x86-tsc");
  ASSERT_TRUE(v.has_value()) << v.error().message;
  EXPECT_EQ(v->matched.size(), 5u);
  EXPECT_TRUE(v->unmatched_vmm.empty());
  ASSERT_EQ(v->unmatched_kernel.size(), 5u);
  for (size_t i = 0; i < 4; ++i) EXPECT_EQ(v->unmatched_kernel[i].reason, kReasonBeforeDump);
  EXPECT_EQ(v->unmatched_kernel[4].reason, kReasonInProgress);
}

// sched_switch splits the time the vCPU thread was switched out of the part it fell in.
// Exit i: kernel [t, t+22us), handler [t+5us, t+15us). The thread is switched out for 2 us
// inside kernel-before (preempted), 3 us inside the handler (blocked) and 1 us inside
// kernel-after (blocked); another thread's switches change nothing.
TEST(JointView, SchedSwitchSplitsOffCpuTimeOutOfEachPart) {
  Case c = MakeCase(4);
  std::vector<SchedSwitch> sched;
  for (int i = 0; i < 4; ++i) {
    const uint64_t t = 1'000'000 + static_cast<uint64_t>(i) * kPeriod;
    sched.push_back({t + 1'000, 4242, 0, true});    // preempted in kernel-before
    sched.push_back({t + 3'000, 0, 4242, false});   // back: 2 us off
    sched.push_back({t + 8'000, 4242, 77, false});  // sleeps in the handler
    sched.push_back({t + 9'000, 77, 0, false});     // another thread: not ours
    sched.push_back({t + 11'000, 0, 4242, false});  // back: 3 us off
    sched.push_back({t + 18'000, 4242, 0, false});  // blocked in kernel-after
    sched.push_back({t + 19'000, 0, 4242, false});  // back: 1 us off
  }
  auto v = BuildJointView(c.dump, c.kernel, "x86-tsc", {}, &sched);
  ASSERT_TRUE(v.has_value()) << v.error().message;
  EXPECT_TRUE(v->sched_recorded);
  EXPECT_EQ(v->sched_switches, sched.size());
  ASSERT_EQ(v->matched.size(), 4u);
  for (const JointExit& j : v->matched) {
    EXPECT_EQ(j.kernel_ns, kBefore + kHandler + kAfter);
    EXPECT_EQ(j.off_cpu_ns, 6'000u);
    EXPECT_EQ(j.off_cpu_runnable_ns, 2'000u);
    EXPECT_EQ(j.before_ns, kBefore - 2'000);
    EXPECT_EQ(j.handler_ns, kHandler - 3'000);
    EXPECT_EQ(j.after_ns, kAfter - 1'000);
    EXPECT_EQ(j.handler_wall_ns, kHandler);
    EXPECT_EQ(j.before_ns + j.handler_ns + j.after_ns + j.off_cpu_ns, j.kernel_ns);
  }
  const JointGroups g = GroupJointExits(v->matched);
  ASSERT_FALSE(g.by_kind.empty());
  EXPECT_EQ(g.by_kind[0].off_cpu.p50_ns, 6'000u);
}

// A thread first seen switching in was off since the trace began; one switched out at the
// end stays off to the end. Without sched records nothing is split.
TEST(JointView, SchedSwitchAtTheEdgesAndAbsent) {
  Case c = MakeCase(2);
  const uint64_t t1 = 1'000'000 + kPeriod;
  std::vector<SchedSwitch> sched = {
      {1'000'000 + 2'000, 0, 4242, false},  // switches in 2 us into exit 0: off before
      {t1 + 20'000, 4242, 0, true},         // out 2 us before exit 1 ends, never back
  };
  auto v = BuildJointView(c.dump, c.kernel, "x86-tsc", {}, &sched);
  ASSERT_TRUE(v.has_value()) << v.error().message;
  ASSERT_EQ(v->matched.size(), 2u);
  EXPECT_EQ(v->matched[0].off_cpu_ns, 2'000u);
  EXPECT_EQ(v->matched[0].before_ns, kBefore - 2'000);
  EXPECT_EQ(v->matched[1].off_cpu_ns, 2'000u);
  EXPECT_EQ(v->matched[1].off_cpu_runnable_ns, 2'000u);
  EXPECT_EQ(v->matched[1].after_ns, kAfter - 2'000);

  std::vector<SchedSwitch> none;
  auto w = BuildJointView(c.dump, c.kernel, "x86-tsc", {}, &none);
  ASSERT_TRUE(w.has_value()) << w.error().message;
  EXPECT_FALSE(w->sched_recorded);
  for (const JointExit& j : w->matched) {
    EXPECT_EQ(j.off_cpu_ns, 0u);
    EXPECT_EQ(j.before_ns + j.handler_ns + j.after_ns, j.kernel_ns);
  }
}

// The off-CPU spans the timeline draws (JointExit::off_cpu_spans): inside the exit, in order,
// disjoint, summing to off_cpu_ns (and the preempted ones to off_cpu_runnable_ns).
TEST(JointViewSched, OffCpuSpansSumToTheSplit) {
  const std::string dump_path = KvmHost("joint-sched.esdump");
  auto dump = ReadDump(dump_path);
  ASSERT_TRUE(dump);
  auto v = BuildJointViewFromTrace(*dump, dump_path, KvmHost("joint-sched.dat"));
  ASSERT_TRUE(v) << v.error().message;
  size_t with_spans = 0;
  for (const JointExit& j : v->matched) {
    uint64_t sum = 0, runnable = 0, at = j.kernel_start_ns;
    for (const JointExit::OffCpuSpan& s : j.off_cpu_spans) {
      EXPECT_GE(s.start_ns, at);
      EXPECT_GT(s.duration_ns, 0u);
      at = s.start_ns + s.duration_ns;
      sum += s.duration_ns;
      if (s.runnable) runnable += s.duration_ns;
    }
    EXPECT_LE(at, j.kernel_start_ns + j.kernel_ns);
    EXPECT_EQ(sum, j.off_cpu_ns);
    EXPECT_EQ(runnable, j.off_cpu_runnable_ns);
    with_spans += !j.off_cpu_spans.empty();
  }
  EXPECT_GT(with_spans, 0u);
  // Without sched_switch records there are none.
  const std::string blk = KvmHost("joint-blk.esdump");
  auto d2 = ReadDump(blk);
  ASSERT_TRUE(d2);
  auto v2 = BuildJointViewFromTrace(*d2, blk, KvmHost("joint-blk.dat"));
  ASSERT_TRUE(v2);
  for (const JointExit& j : v2->matched) EXPECT_TRUE(j.off_cpu_spans.empty());
}

}  // namespace
}  // namespace exitscope::analysis
