// The perf-kvm-stat table layout, JSON and CSV output, histograms.
#include "report/kvm_report.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <sstream>
#include <string>

namespace exitscope::report {
namespace {

using analysis::KvmAggregator;
using analysis::KvmAnalysisOptions;
using analysis::KvmEventClass;

ExitEvent Exit(std::string_view reason, uint64_t dur) {
  ExitEvent e;
  e.reason = reason;
  e.duration_ns = dur;
  e.vm = 16330;
  return e;
}

std::unique_ptr<KvmAggregator> Sample(KvmAnalysisOptions o = {}) {
  auto agg = std::make_unique<KvmAggregator>(std::move(o));
  // perf kvm stat's example rows (docs/kvm.md), reproduced with round numbers.
  for (int i = 0; i < 354; ++i) agg->OnExit(Exit("HC_WRMSR", 280 + static_cast<uint64_t>(i)));
  for (int i = 0; i < 155; ++i)
    agg->OnExit(Exit("HC_IRQ_HALT", 16660 + 1000 * static_cast<uint64_t>(i)));
  agg->Finish();
  return agg;
}

TEST(KvmReport, TableHasPerfLayoutHeaderAndFooter) {
  auto agg = Sample();
  sources::KvmPairingStats stats;
  stats.records_total = 1000;
  stats.exits = 509;
  KvmReportContext ctx{
      .input = "x.dat", .format = "trace-cmd .dat", .clock = "local", .pairing = &stats};
  const std::string t = RenderKvmTable(agg->analysis(), ctx, {});
  EXPECT_NE(t.find("Analyze events for all VMs, all VCPUs:\n"), std::string::npos) << t;
  // perf: "%20s %10s %9s %9s %11s %11s %16s".
  EXPECT_NE(t.find("             VM-EXIT    Samples  Samples%     Time%    Min Time    Max Time"
                   "         Avg time"),
            std::string::npos)
      << t;
  // A row: "%20s %10llu %8.2f%% %8.2f%% %9.2fus %9.2fus %9.2fus ( +-%7.2f%% )".
  std::istringstream in(t);
  std::string line, wrmsr;
  while (std::getline(in, line)) {
    if (line.find("HC_WRMSR") != std::string::npos) wrmsr = line;
  }
  ASSERT_FALSE(wrmsr.empty());
  EXPECT_EQ(wrmsr.substr(0, 20), "            HC_WRMSR");
  EXPECT_EQ(wrmsr.substr(20, 11), "        354");
  EXPECT_EQ(wrmsr.substr(32, 10), "   69.55% ");
  EXPECT_NE(wrmsr.find("      0.28us "), std::string::npos) << wrmsr;
  EXPECT_NE(wrmsr.find("( +-"), std::string::npos);
  EXPECT_NE(t.find("\nTotal Samples:509, Total events handled time:"), std::string::npos) << t;
  EXPECT_NE(t.find("standard error of the mean"), std::string::npos);
  EXPECT_NE(t.find("509 exits paired"), std::string::npos) << t;
  // Default sort by samples: HC_WRMSR (354) before HC_IRQ_HALT (155).
  EXPECT_LT(t.find("HC_WRMSR"), t.find("HC_IRQ_HALT"));
  // --key time: HC_IRQ_HALT holds most of the time.
  const std::string by_time =
      RenderKvmTable(agg->analysis(), ctx, {.sort = analysis::KvmSortKey::kTime});
  EXPECT_LT(by_time.find("HC_IRQ_HALT"), by_time.find("HC_WRMSR"));
}

TEST(KvmReport, PercentilesHistogramAndScopes) {
  auto agg = Sample({.per_vcpu = true, .per_vm = true});
  KvmReportContext ctx{.input = "x", .pid = -1, .vcpu = -1};
  const std::string t =
      RenderKvmTable(agg->analysis(), ctx,
                     {.percentiles = true, .histogram = true, .per_vm = true, .per_vcpu = true});
  EXPECT_NE(t.find("p99.9"), std::string::npos);
  EXPECT_NE(t.find("Analyze events for VM 16330, all VCPUs:"), std::string::npos) << t;
  EXPECT_NE(t.find("Analyze events for VM 16330, VCPU 0:"), std::string::npos) << t;
  EXPECT_NE(t.find("HC_IRQ_HALT (155 samples)"), std::string::npos) << t;
  EXPECT_NE(t.find("|#"), std::string::npos);
  EXPECT_NE(t.find("log-linear histogram"), std::string::npos);
}

TEST(KvmReport, HistogramBinsCoverEverySample) {
  analysis::KvmRow row;
  row.key = "IO";
  for (uint64_t v : {1000, 1500, 3000, 3100, 3200, 70000}) row.stats.Add(v);
  const std::string h = RenderKvmHistogram(row, 10);
  // Bins 512ns-1us .. 64us-128us; counts 2 (1000,1500 in [512? no: [1024?) ...) sum to 6.
  std::istringstream in(h);
  std::string line;
  uint64_t total = 0;
  int bins = 0;
  std::getline(in, line);
  EXPECT_EQ(line, "IO (6 samples)");
  while (std::getline(in, line)) {
    const size_t bar = line.rfind('|');
    ASSERT_NE(bar, std::string::npos) << line;
    total += std::stoull(line.substr(bar + 1));
    ++bins;
  }
  EXPECT_EQ(total, 6u);
  EXPECT_EQ(bins, 8);  // 512 ns .. 128 us: 2^9 .. 2^16
}

TEST(KvmReport, JsonIsStableAndComplete) {
  auto agg = Sample({.slow_ns = 16660 + 1000 * 154});  // the longest HC_IRQ_HALT only
  sources::KvmPairingStats stats;
  stats.records[static_cast<size_t>(sources::KvmEventType::kUserspaceExit)] = 7;
  stats.unpaired_exits = 2;
  KvmReportContext ctx{.input = "x.dat",
                       .format = "trace-cmd .dat",
                       .clock = "x86-tsc",
                       .tsc_khz = 2596000,
                       .pairing = &stats,
                       .list_slow_exits = true};
  const auto j = nlohmann::json::parse(RenderKvmJson(agg->analysis(), ctx, {.histogram = true}));
  EXPECT_EQ(j["schema"], 1);
  EXPECT_EQ(j["event"], "vmexit");
  EXPECT_EQ(j["input"]["clock"], "x86-tsc");
  EXPECT_EQ(j["input"]["tsc_khz"], 2596000);
  EXPECT_EQ(j["all"]["samples"], 509);
  ASSERT_EQ(j["all"]["rows"].size(), 2u);
  const auto& row = j["all"]["rows"][0];
  EXPECT_EQ(row["key"], "HC_WRMSR");
  EXPECT_EQ(row["samples"], 354);
  EXPECT_EQ(row["min_ns"], 280);
  EXPECT_EQ(row["max_ns"], 633);
  for (const char* k : {"samples_pct", "time_ns", "time_pct", "mean_ns", "stderr_pct", "p50_ns",
                        "p99_ns", "p999_ns", "histogram"}) {
    EXPECT_TRUE(row.contains(k)) << k;
  }
  uint64_t hist_total = 0;
  for (const auto& b : row["histogram"]) hist_total += b["count"].get<uint64_t>();
  EXPECT_EQ(hist_total, 354u);
  EXPECT_EQ(j["pairing"]["records"]["kvm_userspace_exit"], 7);
  EXPECT_EQ(j["pairing"]["unpaired_exits"], 2);
  EXPECT_EQ(j["slow_exit_count"], 1);
  ASSERT_EQ(j["slow_exits"].size(), 1u);
  EXPECT_EQ(j["slow_exits"][0]["reason"], "HC_IRQ_HALT");
  EXPECT_EQ(j["slow_exits"][0]["key"], "HC_IRQ_HALT");
  EXPECT_EQ(j["slow_exits"][0]["duration_ns"], 16660 + 1000 * 154);
  EXPECT_EQ(j["slow_exits"][0]["vm"], 16330);
  EXPECT_TRUE(j["filters"]["pid"].is_null());

  // kvm live and kvm stat list none (their context leaves list_slow_exits off).
  ctx.list_slow_exits = false;
  EXPECT_FALSE(
      nlohmann::json::parse(RenderKvmJson(agg->analysis(), ctx, {})).contains("slow_exits"));
}

TEST(KvmReport, CsvHasHeaderAndOneLinePerRow) {
  auto agg = Sample({.per_vm = true});
  const std::string csv = RenderKvmCsv(agg->analysis(), {}, {.per_vm = true});
  std::istringstream in(csv);
  std::string line;
  std::getline(in, line);
  EXPECT_EQ(line.rfind("scope,vm,vcpu,key,name,samples,", 0), 0u);
  EXPECT_EQ(std::count(line.begin(), line.end(), ','), 16) << line;  // 17 columns, `stack` last
  int rows = 0;
  while (std::getline(in, line)) {
    ++rows;
    EXPECT_EQ(std::count(line.begin(), line.end(), ','), 16) << line;  // `stack` empty here
  }
  EXPECT_EQ(rows, 4);  // 2 rows for all, 2 for VM 16330
}

TEST(KvmReport, SlowExitLine) {
  ExitEvent e = Exit("IO", 39500);
  e.start_ns = 123;
  e.vcpu = 1;
  e.device = "com1";
  e.reg = "THR";
  EXPECT_EQ(FormatKvmSlowExit(e, "0x3f8:POUT"),
            "123 VM 16330, vcpu 1: IO 0x3f8:POUT (com1.THR) event took 39usec");
}

TEST(KvmReport, AccessesHandledInTheKernelAreCountedApartAndUntimed) {
  KvmAggregator agg({.event = KvmEventClass::kIoport});
  for (int i = 0; i < 3; ++i) {
    ExitEvent w;  // a coalesced 0x70 write: no exit of its own
    w.reason = "PIO";
    w.subkey_kind = SubKeyKind::kPort;
    w.subkey = 0x70;
    w.dir = AccessDir::kWrite;
    w.kernel_access = true;
    w.end = ExitEnd::kNotTraced;
    agg.OnExit(w);
    ExitEvent r = Exit("IO", 8000);  // the in 0x71 that exits
    r.userspace = true;
    r.subkey_kind = SubKeyKind::kPort;
    r.subkey = 0x71;
    r.dir = AccessDir::kRead;
    agg.OnExit(r);
  }
  ExitEvent open = Exit("IO", 0);
  open.userspace = true;
  open.subkey_kind = SubKeyKind::kPort;
  open.subkey = 0xf4;
  open.dir = AccessDir::kWrite;
  open.end = ExitEnd::kOpenAtEnd;
  open.start_ns = 777;
  agg.OnExit(open);
  agg.Finish();
  sources::KvmPairingStats stats;
  stats.exits = 7;
  stats.kernel_accesses = 3;
  stats.open_at_end = 1;
  stats.unpaired_exits = 1;
  stats.userspace_exits = 3;
  KvmReportContext ctx{.input = "q.dat", .format = "trace-cmd .dat", .pairing = &stats};
  const std::string t = RenderKvmTable(agg.analysis(), ctx, {});
  EXPECT_NE(t.find("To VMM In kernel"), std::string::npos) << t;
  std::istringstream lines(t);
  std::string line, row70, row71;
  while (std::getline(lines, line)) {
    if (line.find("0x70:POUT") != std::string::npos) row70 = line;
    if (line.find("0x71:PIN") != std::string::npos) row71 = line;
  }
  EXPECT_EQ(row70.rfind("           0x70:POUT          3    50.00%         -           -", 0), 0u)
      << t;
  EXPECT_NE(row70.find("         0         3"), std::string::npos) << row70;
  EXPECT_NE(row71.find("         3         0"), std::string::npos) << row71;
  EXPECT_NE(row71.find("8.00us"), std::string::npos) << row71;
  EXPECT_NE(t.find("Total Samples:6, "), std::string::npos) << t;
  EXPECT_NE(t.find("Handled in the kernel: 3 accesses"), std::string::npos) << t;
  EXPECT_NE(t.find("Open at end of trace: 1 exits"), std::string::npos) << t;
  EXPECT_NE(t.find("  open at end of trace: 777 VM 16330, vcpu 0: IO 0xf4:POUT"), std::string::npos)
      << t;
  EXPECT_NE(t.find("3 exits paired"), std::string::npos) << t;

  const auto j = nlohmann::json::parse(RenderKvmJson(agg.analysis(), ctx, {}));
  EXPECT_EQ(j["all"]["samples"], 6);
  EXPECT_EQ(j["all"]["in_kernel"], 3);
  EXPECT_EQ(j["open_at_end_count"], 1);
  EXPECT_EQ(j["open_at_end"][0]["key"], "0xf4:POUT");
  EXPECT_EQ(j["open_at_end"][0]["start_ns"], 777);
  EXPECT_EQ(j["pairing"]["paired"], 3);
  EXPECT_EQ(j["pairing"]["kernel_accesses"], 3);
  for (const auto& row : j["all"]["rows"]) {
    if (row["key"] == "0x70:POUT") {
      EXPECT_EQ(row["in_kernel"], 3);
      EXPECT_EQ(row["to_vmm"], 0);
      EXPECT_EQ(row["timed_samples"], 0);
      EXPECT_TRUE(row["mean_ns"].is_null());
    } else {
      EXPECT_EQ(row["to_vmm"], 3);
      EXPECT_EQ(row["min_ns"], 8000);
    }
  }

  // The exit tables leave the accesses out.
  KvmAggregator exits({});
  for (int i = 0; i < 2; ++i) {
    ExitEvent w;
    w.reason = "PIO";
    w.subkey_kind = SubKeyKind::kPort;
    w.kernel_access = true;
    w.end = ExitEnd::kNotTraced;
    exits.OnExit(w);
  }
  exits.OnExit(Exit("IO", 10));
  EXPECT_EQ(exits.analysis().all.samples, 1u);
  EXPECT_EQ(exits.analysis().kernel_accesses_skipped, 2u);
}

TEST(KvmReport, JsonNeverAbortsOnBytesThatAreNotUtf8) {
  KvmAggregator agg({});
  const std::string latin1 = "caf\xe9";  // a Latin-1 reason / file name
  agg.OnExit(Exit(latin1, 10));
  agg.Finish();
  KvmReportContext ctx{.input = "trace-\xff\xfe.txt", .format = "trace-cmd report"};
  std::string out;
  ASSERT_NO_THROW(out = RenderKvmJson(agg.analysis(), ctx, {}));
  const auto j = nlohmann::json::parse(out);
  EXPECT_EQ(j["input"]["file"], "trace-\xef\xbf\xbd\xef\xbf\xbd.txt");  // U+FFFD each
  EXPECT_EQ(j["all"]["rows"][0]["key"], "caf\xef\xbf\xbd");
}

}  // namespace
}  // namespace exitscope::report
