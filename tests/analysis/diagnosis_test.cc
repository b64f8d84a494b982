// The diagnosis on the real captures of testdata/kvm-host and testdata/kvm (their READMEs say
// how each was made): every group, share and cause checked against figures this test computes
// itself, by brute force, from the same events (no shared code but TargetName, the key).
#include "analysis/diagnosis.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "analysis/exit_summary.h"
#include "analysis/exit_table.h"
#include "analysis/joint_view.h"
#include "sources/dump_source.h"
#include "sources/source.h"

namespace exitscope::analysis {
namespace {

std::string KvmHost(const char* f) {
  return std::string(EXITSCOPE_TESTDATA_DIR) + "/kvm-host/" + f;
}

// Every event of a stream, kept.
struct Everything final : EventSink {
  std::vector<KeptExit> exits;
  struct Io {
    std::string device;
    uint64_t id, submit, complete;  // complete: UINT64_MAX while open
  };
  std::vector<Io> ios;
  std::vector<std::pair<std::string, uint64_t>> queue_full;
  void OnExit(const ExitEvent& e) override { exits.emplace_back(e); }
  void OnDeviceEvent(const DeviceEvent& e) override {
    if (e.type == DeviceEventType::kIoSubmit)
      ios.push_back({std::string(e.device), e.io_id, e.time_ns, UINT64_MAX});
    if (e.type == DeviceEventType::kIoComplete)
      for (Io& io : ios)
        if (io.device == e.device && io.id == e.io_id && io.complete == UINT64_MAX)
          io.complete = e.time_ns;
    if (e.type == DeviceEventType::kQueueFull)
      queue_full.emplace_back(std::string(e.device), e.time_ns);
  }
};

struct Expected {
  uint64_t count = 0, lost = 0, io = 0, queue_full = 0, stuck = 0;
  std::set<uint32_t> vcpus;
};

const DiagnosisGroup* Find(const Diagnosis& d, const std::string& cause, bool slow) {
  for (const DiagnosisGroup& g : d.groups)
    if (g.cause == cause && g.slow == slow && !g.open) return &g;
  for (const DiagnosisGroup& g : d.idle)
    if (g.cause == cause && g.slow == slow && !g.open) return &g;
  return nullptr;
}

const DiagnosisEvidence* Evidence(const DiagnosisGroup& g, const std::string& kind) {
  for (const DiagnosisEvidence& e : g.evidence)
    if (e.kind == kind) return &e;
  return nullptr;
}

// A dump's diagnosis against a brute-force walk of its events.
void CheckDump(const std::string& path) {
  SCOPED_TRACE(path);
  auto dump = ReadDump(path);
  ASSERT_TRUE(dump.has_value()) << dump.error().message;
  DiagnosisBuilder b({.slow = kDumpSlowRule, .key = nullptr});
  Everything all;
  TeeSink tee({&b, &all});
  Summarize(*dump, {}, &tee);
  const Diagnosis d = b.Finish();

  std::map<std::pair<std::string, bool>, Expected> want;
  std::map<uint32_t, uint64_t> lost, idle;
  uint64_t first = UINT64_MAX, last = 0, slow = 0;
  for (const KeptExit& e : all.exits) {
    if (e.open_at_end()) continue;  // none in these dumps: checked below
    const bool is_idle = e.reason == "HLT";
    const bool is_slow = !is_idle && (e.flags & (kExitFlagSlow | kExitFlagStalled)) != 0;
    std::string cause = std::string(e.reason);
    if (e.subkey_kind == SubKeyKind::kPort || e.subkey_kind == SubKeyKind::kMmio)
      cause = TargetName(e.view()) + " " + std::string(ToString(e.dir));
    Expected& x = want[{cause, is_slow}];
    ++x.count;
    x.lost += e.duration_ns;
    x.vcpus.insert(e.vcpu);
    (is_idle ? idle : lost)[e.vcpu] += e.duration_ns;
    first = std::min(first, e.start_ns);
    last = std::max(last, e.start_ns + e.duration_ns);
    slow += is_slow ? 1 : 0;
    if (!is_slow) continue;
    x.stuck += (e.flags & kExitFlagStalled) != 0 ? 1 : 0;
    const uint64_t end = e.start_ns + e.duration_ns;
    bool io = false, qf = false;
    for (const auto& i : all.ios)
      io = io || (i.device == e.device && i.submit <= end && i.complete >= e.start_ns);
    for (const auto& [dev, t] : all.queue_full)
      qf = qf || (dev == e.device && t >= e.start_ns && t <= end);
    x.io += io ? 1 : 0;
    x.queue_full += qf ? 1 : 0;
  }
  for (const KeptExit& e : all.exits) ASSERT_FALSE(e.open_at_end());

  EXPECT_EQ(d.exits, all.exits.size());
  EXPECT_EQ(d.slow_exits, slow);
  EXPECT_EQ(d.span_ns, last - first);
  EXPECT_EQ(d.groups.size() + d.idle.size(), want.size());
  for (const auto& [key, x] : want) {
    SCOPED_TRACE(key.first);
    const DiagnosisGroup* g = Find(d, key.first, key.second);
    ASSERT_NE(g, nullptr);
    EXPECT_EQ(g->count, x.count);
    EXPECT_EQ(g->lost_ns, x.lost);
    EXPECT_EQ(std::set<uint32_t>(g->vcpus.begin(), g->vcpus.end()), x.vcpus);
    EXPECT_DOUBLE_EQ(
        g->share, static_cast<double>(x.lost) / (static_cast<double>(d.span_ns) * d.vcpus.size()));
    const DiagnosisEvidence* io = Evidence(*g, "io-in-flight");
    EXPECT_EQ(io ? io->exits : 0, x.io);
    const DiagnosisEvidence* qf = Evidence(*g, "queue-full");
    EXPECT_EQ(qf ? qf->exits : 0, x.queue_full);
    const DiagnosisEvidence* st = Evidence(*g, "stuck");
    EXPECT_EQ(st ? st->exits : 0, x.stuck);
  }
  for (const DiagnosisVcpu& v : d.vcpus) {
    EXPECT_EQ(v.lost_ns, lost[v.vcpu]) << "vCPU " << v.vcpu;
    EXPECT_EQ(v.idle_ns, idle[v.vcpu]) << "vCPU " << v.vcpu;
    EXPECT_DOUBLE_EQ(v.share, static_cast<double>(lost[v.vcpu]) / d.span_ns);
  }
  // Ranked by time lost.
  for (size_t i = 1; i < d.groups.size(); ++i)
    EXPECT_GE(d.groups[i - 1].lost_ns, d.groups[i].lost_ns);
}

TEST(DiagnosisDump, EveryGroupShareAndCauseOfTheRealDumps) {
  for (const char* f : {"blk-backend-delay.esdump", "mmio-storm.esdump", "joint-blk.esdump",
                        "joint-sched.esdump", "hello-lsr-delay.esdump"})
    CheckDump(KvmHost(f));
}

// blk-backend-delay: the demo's run. Both vCPUs lost most of the run to the SQ doorbells, each
// slow exit with an nvme0 I/O in flight: the first two causes, and nothing else slow.
TEST(DiagnosisDump, BackendDelayNamesBothDoorbellsAndTheIoInFlight) {
  auto dump = ReadDump(KvmHost("blk-backend-delay.esdump"));
  ASSERT_TRUE(dump.has_value());
  DiagnosisBuilder b({.slow = kDumpSlowRule, .key = nullptr});
  Summarize(*dump, {}, &b);
  const Diagnosis d = b.Finish();
  ASSERT_GE(d.groups.size(), 2u);
  EXPECT_FALSE(d.all_well());
  const std::set<std::string> top = {d.groups[0].cause, d.groups[1].cause};
  EXPECT_EQ(top, (std::set<std::string>{"nvme0.SQ1TDBL write", "nvme0.SQ2TDBL write"}));
  for (int i = 0; i < 2; ++i) {
    const DiagnosisGroup& g = d.groups[i];
    EXPECT_TRUE(g.slow);
    ASSERT_FALSE(g.evidence.empty());
    EXPECT_EQ(g.evidence.front().kind, "io-in-flight");
    EXPECT_EQ(g.evidence.front().device, "nvme0");
    EXPECT_EQ(g.evidence.front().exits, g.count);
    // The injected delay is 300 ms: the I/O was as old as the exit when it ended.
    EXPECT_GT(g.evidence.front().ns, 290'000'000u);
    EXPECT_GT(g.typical_ns, 290'000'000u);
  }
  for (size_t i = 2; i < d.groups.size(); ++i) EXPECT_FALSE(d.groups[i].slow) << d.groups[i].cause;
  ASSERT_EQ(d.vcpus.size(), 2u);
  for (const DiagnosisVcpu& v : d.vcpus) EXPECT_GT(v.share, 0.5) << v.vcpu;
}

// mmio-storm: many fast exits, nothing slow or stuck: all well.
TEST(DiagnosisDump, AStormOfFastExitsIsAllWell) {
  auto dump = ReadDump(KvmHost("mmio-storm.esdump"));
  ASSERT_TRUE(dump.has_value());
  DiagnosisBuilder b({.slow = kDumpSlowRule, .key = nullptr});
  Summarize(*dump, {}, &b);
  const Diagnosis d = b.Finish();
  EXPECT_TRUE(d.all_well());
  EXPECT_GT(d.exits, 1000u);
}

// The stack of the C example's stuck doorbell: the blocking call and the VMM's own frame.
TEST(DiagnosisDump, TheStuckThreadsStackNamesTheBlockingCallAndTheVmmFrame) {
  auto dump = ReadDump(std::string(EXITSCOPE_TESTDATA_DIR) + "/dumps/v4-c-example-stacks.esdump");
  ASSERT_TRUE(dump.has_value());
  DiagnosisBuilder b({.slow = kDumpSlowRule, .key = nullptr});
  Summarize(*dump, {}, &b);
  const Diagnosis d = b.Finish();
  ASSERT_FALSE(d.groups.empty());
  const DiagnosisEvidence* st = Evidence(d.groups.front(), "stack");
  ASSERT_NE(st, nullptr);
  EXPECT_EQ(st->call, "__nanosleep");
  EXPECT_EQ(st->kernel, "hrtimer_nanosleep");
  EXPECT_EQ(st->frame.rfind("main (c_example.c:", 0), 0u) << st->frame;
  EXPECT_EQ(st->exits, 1u);
}

// A kernel trace: every exit's kernel time, per vCPU and per reason, as a brute-force sum.
void CheckTrace(const std::string& path) {
  SCOPED_TRACE(path);
  auto src = sources::OpenSource(path, {});
  ASSERT_TRUE(src.has_value()) << src.error().message;
  constexpr uint64_t kSlow = 20'000'000;
  DiagnosisBuilder b({.slow = {.threshold_ns = kSlow}, .key = nullptr});
  Everything all;
  TeeSink tee({&b, &all});
  ASSERT_TRUE(static_cast<bool>((*src)->Run(&tee)));
  const Diagnosis d = b.Finish();
  std::map<std::pair<uint32_t, uint32_t>, uint64_t> lost;
  std::map<std::pair<std::string, bool>, Expected> want;
  uint64_t exits = 0, open = 0;
  for (const KeptExit& e : all.exits) {
    if (e.kernel_access) continue;
    ++exits;
    open += e.open_at_end() ? 1 : 0;
    if (e.end != ExitEnd::kSeen) continue;
    const bool is_idle = e.reason == "HLT" || e.user_reason == "HLT";
    if (!is_idle) lost[{e.vm, e.vcpu}] += e.duration_ns;
    Expected& x = want[{DiagnosisCause(e.view()), !is_idle && e.duration_ns >= kSlow}];
    ++x.count;
    x.lost += e.duration_ns;
  }
  EXPECT_EQ(d.exits, exits);
  EXPECT_EQ(d.open_exits, open);
  for (const DiagnosisVcpu& v : d.vcpus) EXPECT_EQ(v.lost_ns, (lost[{v.vm, v.vcpu}]));
  for (const auto& [key, x] : want) {
    SCOPED_TRACE(key.first);
    const DiagnosisGroup* g = Find(d, key.first, key.second);
    ASSERT_NE(g, nullptr);
    EXPECT_EQ(g->count, x.count);
    EXPECT_EQ(g->lost_ns, x.lost);
  }
}

TEST(DiagnosisTrace, KernelTimePerVcpuAndCauseOfTheRealTraces) {
  CheckTrace(KvmHost("joint-blk.dat"));
  CheckTrace(KvmHost("joint-sched.dat"));
  CheckTrace(std::string(EXITSCOPE_TESTDATA_DIR) + "/kvm/pvm-user64-pio-mmio-hlt.dat");
}

// The joint view of joint-sched (sched_switch recorded on a loaded host): the slow doorbells'
// time is the vCPU thread off the CPU; every group's parts add up to its kernel time.
TEST(DiagnosisJoint, TheSlowDoorbellsTimeIsTheThreadOffTheCpu) {
  const std::string dump_path = KvmHost("joint-sched.esdump");
  auto dump = ReadDump(dump_path);
  ASSERT_TRUE(dump.has_value());
  auto v = BuildJointViewFromTrace(*dump, dump_path, KvmHost("joint-sched.dat"));
  ASSERT_TRUE(v.has_value()) << v.error().message;
  const Diagnosis d = DiagnoseJoint(*v, dump->slow_exit_threshold_ns);

  std::map<std::pair<std::string, bool>, uint64_t> lost, parts, off;
  for (const JointExit& x : v->matched) {
    std::string cause = x.device.empty() ? x.kind : x.device + "." + x.reg;
    if (!x.dir.empty() && (!x.device.empty() || x.kind == "MMIO" || x.kind == "PIO"))
      cause += " " + x.dir;
    const bool slow = x.kind != "HLT" && x.kernel_ns >= dump->slow_exit_threshold_ns;
    lost[{cause, slow}] += x.kernel_ns;
    off[{cause, slow}] += x.off_cpu_ns - x.off_cpu_runnable_ns;
  }
  for (const auto& [key, ns] : lost) {
    SCOPED_TRACE(key.first);
    const DiagnosisGroup* g = Find(d, key.first, key.second);
    ASSERT_NE(g, nullptr);
    EXPECT_EQ(g->lost_ns, ns);
    uint64_t sum = 0;
    for (const DiagnosisEvidence& e : g->evidence) sum += e.ns;
    EXPECT_EQ(sum, ns);  // off-cpu + preempted + handler + before + after = kernel
    const DiagnosisEvidence* o = Evidence(*g, "off-cpu");
    EXPECT_EQ(o ? o->ns : 0, off[key]);
  }
  ASSERT_GE(d.groups.size(), 2u);
  for (int i = 0; i < 2; ++i) {
    EXPECT_TRUE(d.groups[i].slow);
    EXPECT_EQ(d.groups[i].cause.rfind("nvme0.SQ", 0), 0u) << d.groups[i].cause;
    ASSERT_FALSE(d.groups[i].evidence.empty());
    EXPECT_EQ(d.groups[i].evidence.front().kind, "off-cpu");
  }
}

}  // namespace
}  // namespace exitscope::analysis
