#include "exitscope/recorder.h"

#include <gtest/gtest.h>

#include <chrono>
#include <thread>

namespace exitscope {
namespace {

struct Fixture {
  std::unique_ptr<Recorder> rec;
  uint32_t nvme = 0;
  uint32_t com1 = 0;
  std::vector<std::string> log;
  std::mutex mu;

  explicit Fixture(RecorderOptions o = {}) {
    o.start_watchdog = false;
    if (o.num_vcpus == 1) o.num_vcpus = 4;
    auto r = Recorder::Create(o);
    EXPECT_TRUE(r.has_value()) << r.error().message;
    rec = std::move(*r);
    nvme = *rec->address_space().AddDevice({.name = "nvme0", .kind = "nvme"});
    com1 = *rec->address_space().AddDevice({.name = "com1", .kind = "uart16550"});
    EXPECT_TRUE(
        rec->address_space()
            .AddRange(IoSpace::kMmio, 0xfebf0000, 0x4000, nvme, *RegisterMap::Builtin("nvme"))
            .has_value());
    EXPECT_TRUE(rec->address_space()
                    .AddRange(IoSpace::kPio, 0x3f8, 8, com1, *RegisterMap::Builtin("uart16550"))
                    .has_value());
    rec->SetLogSink([this](std::string_view l) {
      std::lock_guard<std::mutex> lock(mu);
      log.emplace_back(l);
    });
  }
  std::vector<std::string> Log() {
    std::lock_guard<std::mutex> lock(mu);
    return log;
  }
};

TEST(RecorderTest, CreateRejectsBadOptions) {
  RecorderOptions o;
  o.num_vcpus = 0;
  auto r = Recorder::Create(o);
  ASSERT_FALSE(r.has_value());
  EXPECT_EQ(r.error().code, ErrorCode::kInvalidArgument);
  EXPECT_NE(r.error().message.find("num_vcpus"), std::string::npos);
  o.num_vcpus = 1;
  o.events_per_vcpu = 1;
  EXPECT_FALSE(Recorder::Create(o).has_value());
}

TEST(RecorderTest, RecordsResolvedExits) {
  Fixture f;
  Recorder& r = *f.rec;
  r.BeginExit(1, ExitKind::kMmio, 0xfebf1008, 4, AccessDir::kWrite, 0x2a);
  r.EndExit(1);
  r.BeginExit(1, ExitKind::kPio, 0x3fd, 1, AccessDir::kRead);
  r.EndExit(1, 0x60);
  r.BeginExit(1, ExitKind::kMmio, 0xdead0000, 4, AccessDir::kRead);
  r.EndExit(1);
  r.BeginExit(1, ExitKind::kHlt);
  r.EndExit(1);
  {
    Recorder::ExitScope s(&r, 2, ExitKind::kMmio, 0xfebf0016, 2, AccessDir::kRead);
    s.set_value(7);
  }
  { Recorder::ExitScope s(nullptr, 2, ExitKind::kHlt); }  // disabled recorder: no-op

  Dump d = r.Snapshot();
  ASSERT_EQ(d.vcpus.size(), 4u);
  const auto& ex = d.vcpus[1].exits;
  ASSERT_EQ(ex.size(), 4u);
  EXPECT_EQ(d.DescribeExit(ex[0]), "exit MMIO write 4B to nvme0.SQ1TDBL (0xfebf1008)");
  EXPECT_EQ(d.DescribeExit(ex[1]), "exit PIO read 1B from com1.LSR (port 0x3fd)");
  EXPECT_EQ(d.DescribeExit(ex[2]), "exit MMIO read 4B from unassigned (0xdead0000)");
  EXPECT_EQ(ex[2].device, kUnassigned);
  EXPECT_EQ(d.DescribeExit(ex[3]), "exit HLT");
  for (const DumpExit& e : ex) {
    EXPECT_EQ(e.vcpu, 1u);
    EXPECT_EQ(e.value, 0u);  // guest data excluded by default
    EXPECT_EQ(e.flags & kExitFlagValue, 0);
  }
  EXPECT_LE(ex[0].start_ns, ex[1].start_ns);
  ASSERT_EQ(d.vcpus[2].exits.size(), 1u);
  EXPECT_EQ(d.RegisterName(d.vcpus[2].exits[0]), "CC+2");
  EXPECT_FALSE(d.includes_guest_data);

  Dump g = r.Snapshot({.include_guest_data = true});
  EXPECT_TRUE(g.includes_guest_data);
  EXPECT_EQ(g.vcpus[1].exits[0].value, 0x2au);
  EXPECT_EQ(g.vcpus[1].exits[1].value, 0x60u);
  EXPECT_EQ(g.vcpus[2].exits[0].value, 7u);
  EXPECT_NE(g.vcpus[1].exits[1].flags & kExitFlagValue, 0);
  EXPECT_EQ(g.vcpus[1].exits[3].flags & kExitFlagValue, 0);  // HLT carries no data
  EXPECT_EQ(r.ring_counters(1).written, 4u);
}

// Exits are resolved off the hot path against the address space as it was when they
// happened: a range removed or moved afterwards does not change what an exit touched.
TEST(RecorderTest, ResolvesAgainstTheAddressSpaceOfTheExit) {
  Fixture f;
  Recorder& r = *f.rec;
  r.BeginExit(0, ExitKind::kMmio, 0xfebf1008, 4, AccessDir::kWrite, 1);
  r.EndExit(0);
  ASSERT_TRUE(r.address_space().MoveRange(IoSpace::kMmio, 0xfebf0000, 0xfe000000).has_value());
  r.BeginExit(0, ExitKind::kMmio, 0xfebf1008, 4, AccessDir::kWrite, 1);  // now unassigned
  r.EndExit(0);
  r.BeginExit(0, ExitKind::kMmio, 0xfe00001c, 4, AccessDir::kRead);  // CSTS at the new base
  r.EndExit(0);

  std::vector<ExitRecord> raw;
  r.flight_recorder().ring(0).Snapshot(&raw);
  ASSERT_EQ(raw.size(), 3u);
  EXPECT_NE(raw[0].flags & kExitFlagUnresolved, 0);  // rings hold the generation, not names
  r.Resolve(&raw[0]);
  EXPECT_EQ(raw[0].device, f.nvme);
  EXPECT_EQ(raw[0].flags & kExitFlagUnresolved, 0);

  const Dump d = r.Snapshot();
  const auto& ex = d.vcpus[0].exits;
  ASSERT_EQ(ex.size(), 3u);
  EXPECT_EQ(ex[0].device, f.nvme);
  EXPECT_EQ(ex[1].device, kUnassigned);
  EXPECT_EQ(ex[2].device, f.nvme);
  EXPECT_EQ(d.RegisterName(ex[2]), "CSTS");
  for (const DumpExit& e : ex) EXPECT_EQ(e.flags & kExitFlagUnresolved, 0);
}

TEST(RecorderTest, CountsMisuse) {
  Fixture f;
  Recorder& r = *f.rec;
  r.BeginExit(99, ExitKind::kHlt);
  r.EndExit(99);
  r.EndExit(0);  // no begin
  r.BeginExit(0, ExitKind::kHlt);
  r.BeginExit(0, ExitKind::kPio, 0x3f8, 1, AccessDir::kWrite, 'A');  // previous never ended
  r.EndExit(0);
  const RecorderCounters c = r.counters();
  EXPECT_EQ(c.bad_vcpu, 2u);
  EXPECT_EQ(c.end_without_begin, 1u);
  EXPECT_EQ(c.begin_without_end, 1u);
  Dump d = r.Snapshot();
  ASSERT_EQ(d.vcpus[0].exits.size(), 2u);
  EXPECT_NE(d.vcpus[0].exits[0].flags & kExitFlagNoEnd, 0);
  EXPECT_EQ(d.vcpus[0].exits[0].kind, ExitKind::kHlt);
  EXPECT_EQ(d.RegisterName(d.vcpus[0].exits[1]), "THR");
}

TEST(RecorderTest, SlowExitLogsOneLineAndCallsHook) {
  Fixture f;
  Recorder& r = *f.rec;
  std::vector<SlowExit> seen;
  // A threshold far above any preemption under `ctest -j` (the fast exit below must stay
  // under it), and a slow exit well over it (TSC-to-ns rounding cannot bring it under).
  r.SetSlowExitPolicy(
      {.threshold_ns = 200'000'000, .hook = [&](const SlowExit& s) { seen.push_back(s); }});
  EXPECT_EQ(r.slow_exit_threshold_ns(), 200'000'000u);
  r.BeginExit(3, ExitKind::kMmio, 0xfebf1008, 4, AccessDir::kWrite, 1);
  r.EndExit(3);  // fast: nothing
  r.BeginExit(3, ExitKind::kMmio, 0xfebf1008, 4, AccessDir::kWrite, 1);
  std::this_thread::sleep_for(std::chrono::milliseconds(250));
  r.EndExit(3);
  ASSERT_EQ(seen.size(), 1u);
  EXPECT_EQ(seen[0].device, "nvme0");
  EXPECT_EQ(seen[0].reg, "SQ1TDBL");
  EXPECT_GE(seen[0].duration_ns, 200'000'000u);
  const auto log = f.Log();
  ASSERT_EQ(log.size(), 1u);
  EXPECT_EQ(log[0].rfind("vCPU 3: exit MMIO write 4B to nvme0.SQ1TDBL (0xfebf1008) took ", 0), 0u)
      << log[0];
  EXPECT_EQ(log[0], seen[0].line);
  EXPECT_EQ(r.counters().slow_exits, 1u);
  const auto findings = r.Findings();
  ASSERT_EQ(findings.size(), 1u);
  EXPECT_EQ(findings[0].type, FindingType::kSlowExit);
  EXPECT_EQ(findings[0].vcpu, 3u);
  Dump d = r.Snapshot();
  ASSERT_EQ(d.vcpus[3].exits.size(), 2u);
  EXPECT_EQ(d.vcpus[3].exits[0].flags & kExitFlagSlow, 0);
  EXPECT_NE(d.vcpus[3].exits[1].flags & kExitFlagSlow, 0);
}

TEST(RecorderTest, MetadataDeviceEventsAndInProgress) {
  Fixture f;
  Recorder& r = *f.rec;
  r.SetAttribute("vmm", "exitscope-run");
  r.SetAttribute("guest", "blk");
  ASSERT_TRUE(r.SetVcpuCounter(0, "kvm.exits", 1234).has_value());
  EXPECT_FALSE(r.SetVcpuCounter(9, "kvm.exits", 1).has_value());
  r.IoSubmit(f.nvme, 77);
  r.QueueFull(f.nvme, 1);
  r.BackendError(f.nvme, -5, "EIO from backing file");
  r.IoComplete(f.nvme, 77, -5);
  r.Note(kUnassigned, "hello");
  r.BeginExit(2, ExitKind::kMmio, 0xfebf0014, 4, AccessDir::kWrite, 1);  // left open
  Dump d = r.Snapshot();
  EXPECT_EQ(d.Attribute("vmm"), "exitscope-run");
  EXPECT_EQ(d.Attribute("guest"), "blk");
  EXPECT_EQ(d.vcpus[0].named_counters.at("kvm.exits"), 1234u);
  ASSERT_EQ(d.device_events.size(), 5u);
  EXPECT_EQ(d.device_events[0].type, DeviceEventType::kIoSubmit);
  EXPECT_EQ(d.device_events[0].io_id, 77u);
  EXPECT_EQ(d.device_events[2].note, "EIO from backing file");
  EXPECT_EQ(d.device_events[3].status, -5);
  EXPECT_EQ(d.DeviceName(d.device_events[1].device), "nvme0");
  EXPECT_EQ(d.counters.io_in_flight, 0u);
  ASSERT_TRUE(d.vcpus[2].in_progress.has_value());
  EXPECT_EQ(d.DescribeExit(*d.vcpus[2].in_progress), "exit MMIO write 4B to nvme0.CC (0xfebf0014)");
  EXPECT_FALSE(d.vcpus[1].in_progress.has_value());
  EXPECT_EQ(d.process.pid, getpid());
  EXPECT_FALSE(d.process.argv.empty());
  EXPECT_FALSE(d.host.release.empty());
  EXPECT_EQ(d.devices.size(), 2u);
  EXPECT_EQ(d.maps.size(), 2u);
  EXPECT_EQ(d.ranges.size(), 2u);
  r.EndExit(2);
}

TEST(RecorderTest, ClockCalibration) {
  Clock c = Clock::Create(ClockChoice::kAuto);
  const ClockCalibration& cal = c.calibration();
  if (cal.source == ClockSource::kTsc) {
    EXPECT_GT(cal.tsc_hz, 100'000'000u);
    EXPECT_GT(cal.ns_per_tick, 0.0);
  } else {
    EXPECT_EQ(cal.ns_per_tick, 1.0);
  }
  // Converted timestamps track CLOCK_MONOTONIC (generous bound: 50 ms).
  const uint64_t mono = Clock::MonotonicNs();
  const uint64_t conv = c.ToMonotonicNs(c.Now());
  EXPECT_LT(conv > mono ? conv - mono : mono - conv, 50'000'000u);
  Clock m = Clock::Create(ClockChoice::kMonotonic);
  EXPECT_EQ(m.source(), ClockSource::kMonotonic);
  EXPECT_EQ(FormatDurationNs(22'310'000'000ull), "22.31 s");
  EXPECT_EQ(FormatDurationNs(830), "830 ns");
}

}  // namespace
}  // namespace exitscope
