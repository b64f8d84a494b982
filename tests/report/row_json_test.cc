// One JSON schema for rows (docs/json.md): the rows of `inspect --format json` (by_kind,
// by_device, by_register, by_vcpu) and of `kvm report --format json` (rows of every group)
// are the same object with the same keys, on real data: a kvm-host dump and the kernel trace
// of the same run (testdata/kvm-host/joint-blk.*).
#include "report/row_json.h"

#include <gtest/gtest.h>

#include <set>
#include <string>

#include "analysis/kvm_stats.h"
#include "report/exit_health.h"
#include "report/kvm_report.h"
#include "sources/dump_source.h"
#include "sources/kvm_input.h"
#include "sources/kvm_pairing.h"

namespace exitscope::report {
namespace {

const std::string kDir = std::string(EXITSCOPE_TESTDATA_DIR) + "/kvm-host";

std::set<std::string> Keys(const nlohmann::json& row) {
  std::set<std::string> k;
  for (const auto& [key, value] : row.items()) k.insert(key);
  return k;
}

TEST(RowJson, InspectAndKvmRowsHaveTheSameKeys) {
  auto d = ReadDump(kDir + "/joint-blk.esdump");
  ASSERT_TRUE(d) << d.error().message;
  ExitHealthOptions o;
  o.format = OutputFormat::kJson;
  const auto inspect = nlohmann::json::parse(ExitHealthReport(*d, o));

  // The kernel's view of the same run, paired and aggregated as `kvm report` does.
  auto in = sources::KvmInput::Open(kDir + "/joint-blk.dat", {});
  ASSERT_TRUE(in) << in.error().message;
  analysis::KvmAggregator agg({.event = analysis::KvmEventClass::kIoport});
  sources::KvmPairer pairer({}, &agg);
  const Status st = (*in)->ReadAll(&pairer);
  ASSERT_TRUE(st) << st.error().message;
  agg.Finish();
  const auto kvm = nlohmann::json::parse(RenderKvmJson(agg.analysis(), {}, {}));

  ASSERT_FALSE(kvm["all"]["rows"].empty());
  const std::set<std::string> want = Keys(kvm["all"]["rows"][0]);
  for (const char* k :
       {"key", "name", "samples", "count", "time_ns", "total_ns", "min_ns", "p50_ns", "p99_ns",
        "p999_ns", "max_ns", "mean_ns", "untimed_samples", "in_kernel", "to_vmm"})
    EXPECT_TRUE(want.count(k)) << k;
  for (const auto& r : kvm["all"]["rows"]) EXPECT_EQ(Keys(r), want);
  for (const char* table : {"by_kind", "by_device", "by_register", "by_vcpu"}) {
    ASSERT_FALSE(inspect[table].empty()) << table;
    for (const auto& r : inspect[table]) EXPECT_EQ(Keys(r), want) << table << " " << r.dump();
  }
  // The inspect names of old are the same numbers as the kvm ones.
  for (const auto& r : inspect["by_register"]) {
    EXPECT_EQ(r["count"], r["timed_samples"]);
    EXPECT_EQ(r["total_ns"], r["time_ns"]);
    EXPECT_EQ(r["samples"], r["count"]) << "a dump's exits all have a time";
  }
}

// The histogram bins cover every timed sample.
TEST(RowJson, HistogramBinsCountEveryTimedSample) {
  auto d = ReadDump(kDir + "/mmio-storm.esdump");
  ASSERT_TRUE(d) << d.error().message;
  analysis::KvmAggregator agg({.event = analysis::KvmEventClass::kMmio});
  sources::DumpSource src(*d);
  src.Emit(&agg);
  agg.Finish();
  ASSERT_FALSE(agg.analysis().all.rows.empty());
  for (const auto& r : agg.analysis().all.rows) {
    const nlohmann::json j = RowJson(*r, agg.analysis().all, /*histogram=*/true);
    uint64_t n = 0, last_le = 0;
    for (const auto& b : j["histogram"]) {
      n += b["count"].get<uint64_t>();
      EXPECT_GT(b["le_ns"].get<uint64_t>(), last_le);
      last_le = b["le_ns"];
    }
    EXPECT_EQ(n, r->stats.count()) << r->key;
    EXPECT_FALSE(RowJson(*r, agg.analysis().all, false).contains("histogram"));
  }
}

}  // namespace
}  // namespace exitscope::report
