// The exit-health summary of a dump, fed through the one event stream (DumpSource ->
// ExitSummaryBuilder), on the real dumps of testdata/kvm-host (README.md there says how each was
// made): the same numbers as a direct walk of the Dump, the way Summarize read it before it
// became an EventSink; and the same rows as KvmAggregator's from the same stream.
#include "analysis/exit_summary.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cinttypes>
#include <cstdio>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "analysis/kvm_stats.h"
#include "sources/dump_source.h"

namespace exitscope::analysis {
namespace {

const std::string kDir = std::string(EXITSCOPE_TESTDATA_DIR) + "/kvm-host";

std::vector<std::string> RealDumps() {
  std::vector<std::string> out;
  for (const auto& f : std::filesystem::directory_iterator(kDir))
    if (f.path().extension() == ".esdump") out.push_back(f.path().string());
  std::sort(out.begin(), out.end());
  return out;
}

std::string Hex(uint64_t v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "0x%" PRIx64, v);
  return buf;
}

// The register key of a dump exit, read straight from the Dump's tables.
std::string RegisterKey(const Dump& d, const DumpExit& e) {
  std::string t;
  if (e.device == kUnassigned) {
    t = "unassigned " + Hex(e.addr);
  } else {
    t = d.DeviceName(e.device);
    const std::string reg = d.RegisterName(e);
    if (!reg.empty()) {
      t += "." + reg;
    } else {
      bool in_range = false;
      for (const DumpRange& r : d.ranges) {
        if (r.space == SpaceOf(e.kind) && e.addr >= r.base && e.addr - r.base < r.size) {
          t += "+" + Hex(e.addr - r.base);
          in_range = true;
          break;
        }
      }
      if (!in_range) t += " " + Hex(e.addr);
    }
  }
  return t + " " + std::string(ToString(e.dir));
}

struct Expect {
  uint64_t count = 0, total = 0, min = UINT64_MAX, max = 0;
  void Add(uint64_t ns) {
    ++count;
    total += ns;
    min = std::min(min, ns);
    max = std::max(max, ns);
  }
};

void ExpectTable(const ExitTable& t, const std::map<std::string, Expect>& want, const char* what) {
  SCOPED_TRACE(what);
  ASSERT_EQ(t.rows.size(), want.size());
  uint64_t last_total = UINT64_MAX;
  for (const auto& r : t.rows) {
    const auto it = want.find(r->key);
    ASSERT_NE(it, want.end()) << r->key;
    EXPECT_EQ(r->stats.count(), it->second.count) << r->key;
    EXPECT_EQ(r->stats.sum(), it->second.total) << r->key;
    EXPECT_EQ(r->stats.min(), it->second.min) << r->key;
    EXPECT_EQ(r->stats.max(), it->second.max) << r->key;
    EXPECT_EQ(r->untimed, 0u);
    EXPECT_EQ(r->in_kernel, 0u) << "every exit of a dump reached the VMM";
    if (std::string(what) != "vcpu") {
      EXPECT_LE(r->stats.sum(), last_total) << "sorted by total time";
      last_total = r->stats.sum();
    }
  }
}

TEST(ExitSummary, RealDumpsThroughTheEventStreamGiveTheDumpsOwnNumbers) {
  const auto files = RealDumps();
  ASSERT_GE(files.size(), 5u);
  for (const std::string& f : files) {
    SCOPED_TRACE(f);
    auto d = ReadDump(f);
    ASSERT_TRUE(d) << d.error().message;
    std::map<std::string, Expect> kinds, devices, registers, vcpus;
    Expect all;
    size_t slow = 0, in_progress = 0;
    for (const DumpVcpu& v : d->vcpus) {
      for (const DumpExit& e : v.exits) {
        all.Add(e.duration_ns);
        kinds[std::string(ToString(e.kind))].Add(e.duration_ns);
        vcpus[std::to_string(e.vcpu)].Add(e.duration_ns);
        if (e.kind == ExitKind::kMmio || e.kind == ExitKind::kPio) {
          devices[e.device == kUnassigned ? "unassigned" : d->DeviceName(e.device)].Add(
              e.duration_ns);
          registers[RegisterKey(*d, e)].Add(e.duration_ns);
        }
        slow += (e.flags & (kExitFlagSlow | kExitFlagStalled)) != 0;
      }
      in_progress += v.in_progress.has_value();
    }
    const ExitSummary s = Summarize(*d, {});
    EXPECT_EQ(s.exits, all.count);
    EXPECT_EQ(s.total_ns, all.total);
    EXPECT_EQ(s.all.count(), all.count);
    EXPECT_EQ(s.all.min(), all.count ? all.min : 0);
    EXPECT_EQ(s.all.max(), all.max);
    ExpectTable(s.by_kind, kinds, "kind");
    ExpectTable(s.by_device, devices, "device");
    ExpectTable(s.by_register, registers, "register");
    ExpectTable(s.by_vcpu, vcpus, "vcpu");
    for (size_t i = 1; i < s.by_vcpu.rows.size(); ++i)
      EXPECT_LT(std::stoul(s.by_vcpu.rows[i - 1]->key), std::stoul(s.by_vcpu.rows[i]->key));
    EXPECT_EQ(s.slow.size(), slow + in_progress);
    EXPECT_EQ(s.findings.size(), d->findings.size());
  }
}

// The names that matter on these dumps: the NVMe doorbell and the UART registers by name.
TEST(ExitSummary, RegisterNamesOfTheRealDumps) {
  auto d = ReadDump(kDir + "/blk-backend-delay.esdump");
  ASSERT_TRUE(d) << d.error().message;
  const ExitSummary s = Summarize(*d, {});
  std::map<std::string, uint64_t> rows;
  for (const auto& r : s.by_register.rows) rows[r->key] = r->stats.count();
  EXPECT_GT(rows["nvme0.SQ1TDBL write"], 0u);
  auto h = ReadDump(kDir + "/hello-lsr-delay.esdump");
  ASSERT_TRUE(h) << h.error().message;
  const ExitSummary hs = Summarize(*h, {});
  rows.clear();
  for (const auto& r : hs.by_register.rows) rows[r->key] = r->stats.count();
  EXPECT_GT(rows["uart0.LSR read"], 0u);
  EXPECT_GT(rows["uart0.THR write"], 0u);
}

// The findings of blk-backend-delay come through the stream with the I/Os in flight at their
// time, replayed from the dump's I/O submit / complete device events.
TEST(ExitSummary, FindingsCarryTheIosInFlight) {
  auto d = ReadDump(kDir + "/blk-backend-delay.esdump");
  ASSERT_TRUE(d) << d.error().message;
  const ExitSummary s = Summarize(*d, {});
  ASSERT_FALSE(s.findings.empty());
  size_t with_io = 0;
  for (const KeptFinding& f : s.findings) {
    with_io += !f.in_flight.empty();
    for (const InflightIo& io : f.in_flight) {
      EXPECT_EQ(io.device_name, "nvme0");
      EXPECT_LE(io.submitted_ns, f.time_ns);
      EXPECT_EQ(io.age_ns, f.time_ns - io.submitted_ns);
    }
  }
  EXPECT_GT(with_io, 0u);
  for (size_t i = 1; i < s.findings.size(); ++i)
    EXPECT_LE(s.findings[i - 1].time_ns, s.findings[i].time_ns);
}

// One stream, one engine: the kvm aggregator fed by the dump source has the summary's rows
// by kind (same key, count, total, min, max, percentiles).
TEST(ExitSummary, KvmAggregatorOnTheSameStreamHasTheSameRows) {
  for (const std::string& f : RealDumps()) {
    SCOPED_TRACE(f);
    auto d = ReadDump(f);
    ASSERT_TRUE(d) << d.error().message;
    const ExitSummary s = Summarize(*d, {});
    KvmAggregator agg({.event = KvmEventClass::kVmexit, .per_vcpu = true});
    sources::DumpSource src(*d);
    src.Emit(&agg);
    agg.Finish();
    const KvmAnalysis& a = agg.analysis();
    ASSERT_EQ(a.all.rows.size(), s.by_kind.rows.size());
    for (const auto& r : s.by_kind.rows) {
      const auto it = std::find_if(a.all.rows.begin(), a.all.rows.end(),
                                   [&](const auto& k) { return k->key == r->key; });
      ASSERT_NE(it, a.all.rows.end()) << r->key;
      EXPECT_EQ((*it)->stats.count(), r->stats.count());
      EXPECT_EQ((*it)->stats.sum(), r->stats.sum());
      EXPECT_EQ((*it)->stats.min(), r->stats.min());
      EXPECT_EQ((*it)->stats.max(), r->stats.max());
      EXPECT_EQ((*it)->stats.Quantile(0.99), r->stats.Quantile(0.99));
    }
    EXPECT_EQ(a.all.samples, s.exits);
    EXPECT_EQ(a.all.time_ns, s.total_ns);
    EXPECT_EQ(a.per_vcpu.size(), s.by_vcpu.rows.size());
    EXPECT_EQ(a.open_at_end, static_cast<uint64_t>(std::count_if(
                                 d->vcpus.begin(), d->vcpus.end(),
                                 [](const DumpVcpu& v) { return v.in_progress.has_value(); })));
  }
}

TEST(ExitSummary, FiltersByVcpuAndDevice) {
  auto d = ReadDump(kDir + "/blk-backend-delay.esdump");
  ASSERT_TRUE(d) << d.error().message;
  const ExitSummary all = Summarize(*d, {});
  uint64_t sum = 0;
  for (const auto& r : all.by_vcpu.rows) {
    const uint32_t v = static_cast<uint32_t>(std::stoul(r->key));
    const ExitSummary one = Summarize(*d, {.vcpu = v, .device = std::nullopt});
    EXPECT_EQ(one.exits, r->stats.count());
    ASSERT_EQ(one.by_vcpu.rows.size(), 1u);
    sum += one.exits;
  }
  EXPECT_EQ(sum, all.exits);
  const ExitSummary nvme = Summarize(*d, {.vcpu = std::nullopt, .device = "nvme0"});
  ASSERT_EQ(nvme.by_device.rows.size(), 1u);
  EXPECT_EQ(nvme.by_device.rows[0]->key, "nvme0");
  EXPECT_EQ(nvme.exits, nvme.by_device.rows[0]->stats.count());
}

}  // namespace
}  // namespace exitscope::analysis
