// A recorder dump as a source of the one event model (sources/dump_source.h), on the real dumps
// of testdata/kvm-host (a kvm-pvm host; README.md there says how each was made): one ExitEvent
// per exit with the dump's own names, the exit in progress as open at end, and every device
// event and finding.
#include "sources/dump_source.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <string>
#include <vector>

namespace exitscope::sources {
namespace {

const std::string kDir = std::string(EXITSCOPE_TESTDATA_DIR) + "/kvm-host";

struct Collect final : EventSink {
  std::vector<ExitEvent> exits;
  std::vector<std::string> devices, regs;  // copies: the views live only as long as the source
  std::vector<DeviceEvent> device_events;
  std::vector<Finding> findings;
  std::vector<std::string> finding_texts;
  void OnExit(const ExitEvent& e) override {
    exits.push_back(e);
    devices.emplace_back(e.device);
    regs.emplace_back(e.reg);
  }
  void OnDeviceEvent(const DeviceEvent& e) override { device_events.push_back(e); }
  void OnFinding(const Finding& f) override {
    findings.push_back(f);
    finding_texts.emplace_back(f.text);
  }
};

std::vector<std::string> RealDumps() {
  std::vector<std::string> out;
  for (const auto& f : std::filesystem::directory_iterator(kDir))
    if (f.path().extension() == ".esdump") out.push_back(f.path().string());
  std::sort(out.begin(), out.end());
  return out;
}

TEST(DumpSource, EveryExitOfEveryRealDumpWithItsOwnNames) {
  const auto files = RealDumps();
  ASSERT_GE(files.size(), 5u) << kDir;
  for (const std::string& f : files) {
    SCOPED_TRACE(f);
    auto d = ReadDump(f);
    ASSERT_TRUE(d) << d.error().message;
    Collect c;
    DumpSource src(*d);
    src.Emit(&c);
    size_t i = 0, with_register = 0;
    for (const DumpVcpu& v : d->vcpus) {
      std::vector<std::pair<const DumpExit*, bool>> want;
      for (const DumpExit& e : v.exits) want.emplace_back(&e, false);
      if (v.in_progress) want.emplace_back(&*v.in_progress, true);
      for (const auto& [e, open] : want) {
        ASSERT_LT(i, c.exits.size());
        const ExitEvent& x = c.exits[i];
        EXPECT_EQ(x.start_ns, e->start_ns);
        EXPECT_EQ(x.duration_ns, e->duration_ns);
        EXPECT_EQ(x.vcpu, e->vcpu);
        EXPECT_EQ(x.vm, static_cast<uint32_t>(d->process.pid));
        EXPECT_EQ(x.reason, ToString(e->kind));
        EXPECT_EQ(x.kind, e->kind);
        EXPECT_EQ(x.dir, e->dir);
        EXPECT_EQ(x.size, e->size);
        EXPECT_EQ(x.flags, e->flags);
        EXPECT_EQ(x.end, open ? ExitEnd::kOpenAtEnd : ExitEnd::kSeen);
        EXPECT_TRUE(x.userspace);
        const bool target = e->kind == ExitKind::kMmio || e->kind == ExitKind::kPio;
        if (target) {
          EXPECT_EQ(x.subkey_kind,
                    e->kind == ExitKind::kPio ? SubKeyKind::kPort : SubKeyKind::kMmio);
          EXPECT_EQ(x.subkey, e->addr);
          EXPECT_EQ(c.devices[i], d->DeviceName(e->device));
          EXPECT_EQ(c.regs[i], d->RegisterName(*e));
          with_register += !c.regs[i].empty();
        } else {
          EXPECT_TRUE(c.devices[i].empty());
        }
        // Guest data only when the dump carries it.
        EXPECT_EQ(x.value, (e->flags & kExitFlagValue) ? e->value : 0);
        ++i;
      }
    }
    EXPECT_EQ(i, c.exits.size());
    EXPECT_GT(with_register, 0u) << "every real dump has exits on named registers";
    ASSERT_EQ(c.device_events.size(), d->device_events.size());
    for (size_t k = 0; k < c.device_events.size(); ++k) {
      EXPECT_EQ(c.device_events[k].type, d->device_events[k].type);
      EXPECT_EQ(c.device_events[k].io_id, d->device_events[k].io_id);
      EXPECT_EQ(c.device_events[k].time_ns, d->device_events[k].time_ns);
    }
    ASSERT_EQ(c.findings.size(), d->findings.size());
    for (size_t k = 0; k < c.findings.size(); ++k) {
      EXPECT_EQ(c.findings[k].type, d->findings[k].type);
      EXPECT_EQ(c.findings[k].vcpu, d->findings[k].vcpu);
      EXPECT_EQ(c.findings[k].duration_ns, d->findings[k].duration_ns);
      EXPECT_EQ(c.finding_texts[k], d->findings[k].text);
    }
  }
}

// blk-backend-delay: the NVMe backend delayed 300 ms on 64 I/Os, so the queue fills and the
// watchdog reports vCPUs stuck in the doorbell write.
TEST(DumpSource, BackendDelayDumpEmitsQueueFullEventsAndWatchdogFindings) {
  auto d = ReadDump(kDir + "/blk-backend-delay.esdump");
  ASSERT_TRUE(d) << d.error().message;
  Collect c;
  DumpSource src(*d);
  src.Emit(&c);
  size_t queue_full = 0, submits = 0, completes = 0, stuck = 0;
  for (const DeviceEvent& e : c.device_events) {
    queue_full += e.type == DeviceEventType::kQueueFull;
    submits += e.type == DeviceEventType::kIoSubmit;
    completes += e.type == DeviceEventType::kIoComplete;
  }
  for (const Finding& f : c.findings) stuck += f.type == FindingType::kStuckExitBegin;
  EXPECT_GT(queue_full, 0u);
  EXPECT_GT(submits, 0u);
  EXPECT_GT(completes, 0u);
  EXPECT_GT(stuck, 0u);
  for (const DeviceEvent& e : c.device_events) EXPECT_EQ(e.device, "nvme0");
  // One spelling: the public ToString of the recorder's enums.
  EXPECT_EQ(ToString(DeviceEventType::kQueueFull), "queue-full");
  EXPECT_EQ(ToString(FindingType::kStuckExitBegin), "stuck-exit");
  EXPECT_EQ(ToString(AccessDir::kWrite), "write");
  uint64_t lost = d->counters.findings_dropped + d->device_event_counters.overwritten +
                  d->device_event_counters.dropped + d->device_event_counters.skipped;
  for (const DumpVcpu& v : d->vcpus) lost += v.counters.overwritten + v.counters.skipped;
  EXPECT_EQ(src.capture().lost_events, lost);
  EXPECT_EQ(src.capture().clock, "CLOCK_MONOTONIC");
}

}  // namespace
}  // namespace exitscope::sources
